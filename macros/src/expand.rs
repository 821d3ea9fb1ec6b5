//! Rewrites the handler: the attribute's extractor joins the handler's arguments, the body runs
//! inside `tower_lock::__private::run` under the lock, and the handler answers a `Response`.

use proc_macro2::{Ident, Span, TokenStream, TokenTree};
use quote::{ToTokens, quote, quote_spanned};
use syn::{
    FnArg, GenericArgument, ItemFn, PatType, PathArguments, ReturnType, Type, parse_quote,
    spanned::Spanned,
};

use crate::{options::Options, template};

/// The name of the attribute's own argument in the rewritten handler.
const PARTS: &str = "__tower_lock_parts";

pub(crate) fn expand(options: &Options, mut item: ItemFn) -> syn::Result<TokenStream> {
    let sig = &item.sig;
    if sig.asyncness.is_none() {
        return Err(syn::Error::new(
            sig.fn_token.span,
            "#[locked] applies to `async fn` handlers only",
        ));
    }
    if let Some(receiver) = sig.receiver() {
        return Err(syn::Error::new(receiver.span(), "#[locked] handlers cannot take `self`"));
    }

    let mut context_arg = None;
    let mut state_ty = None;
    let mut bindings = Vec::new();
    for (index, arg) in sig.inputs.iter().enumerate() {
        let FnArg::Typed(arg) = arg else { continue };
        if is_extension_of_lock_context(&arg.ty) {
            return Err(syn::Error::new(
                arg.ty.span(),
                "under #[locked] the lock is taken after the extractors run, so no \
                 `Extension<LockContext>` exists yet: take `lock: LockContext` instead",
            ));
        }
        if is_lock_context(&arg.ty) {
            if context_arg.is_some() {
                return Err(syn::Error::new(
                    arg.ty.span(),
                    "#[locked] handlers take at most one `LockContext` argument",
                ));
            }
            context_arg = Some(index);
            continue;
        }
        if state_ty.is_none() {
            state_ty = state_type(&arg.ty);
        }
        template::bindings(&arg.pat, &mut bindings);
    }
    // One key, or the set of keys (and the run-time support that takes them).
    let (key, run) = match (&options.key, &options.keys) {
        (Some(key), _) => (template::key_expr(key, &bindings)?, quote!(run)),
        (None, Some(keys)) => {
            let keys = keys
                .iter()
                .map(|key| template::key_expr(key, &bindings))
                .collect::<syn::Result<Vec<_>>>()?;
            (quote!(::std::vec::Vec::from([#(#keys),*])), quote!(run_all))
        }
        (None, None) => return Err(crate::options::missing_key(Span::call_site())),
    };

    let private = quote!(::tower_lock::__private);
    let parts = Ident::new(PARTS, Span::mixed_site());
    let (parts_ty, from_state) = match state_ty {
        Some(ty) => (
            quote!(#private::LockParts<#private::WithState<#ty>>),
            quote!((&&&&&&#private::probe::Probe(&#parts.state.0)).lock_client()),
        ),
        None => {
            (quote!(#private::LockParts<#private::Stateless>), quote!(::core::option::Option::None))
        }
    };

    // The handler keeps its arity (so `#[debug_handler]` above it still matches): the
    // attribute's extractor takes the place of a `LockContext` argument, or pairs with the
    // first argument, or is the only one.
    let mut context_pat: syn::Pat = parse_quote!(_);
    let mut context_ty: Type = parse_quote!(#private::LockContext);
    let inputs = &mut item.sig.inputs;
    if let Some(index) = context_arg {
        if let Some(FnArg::Typed(arg)) = inputs.iter_mut().nth(index) {
            context_pat = (*arg.pat).clone();
            // The handler's own spelling of the type, so its imports stay used.
            context_ty = (*arg.ty).clone();
            *arg = parse_quote!(#parts: #parts_ty);
        }
    } else if let Some(FnArg::Typed(first)) = inputs.first_mut() {
        let PatType { attrs, pat, ty, .. } = first.clone();
        *first = parse_quote!(#(#attrs)* (#parts, #pat): (#parts_ty, #ty));
    } else {
        inputs.push(parse_quote!(#parts: #parts_ty));
    }

    // The body's own type, so `?` and `return` inside it keep their meaning.
    let output = match &item.sig.output {
        ReturnType::Default => quote!(()),
        ReturnType::Type(_, ty) if mentions_impl(ty.to_token_stream()) => quote!(_),
        ReturnType::Type(_, ty) => quote!(#ty),
    };
    let output_span = item.sig.output.span();
    item.sig.output = parse_quote!(-> #private::Response);

    let options = options.to_tokens();
    let block = &item.block;
    let body = quote_spanned! {output_span=>
        #[allow(unused_imports)]
        use #private::probe::{
            ViaAny as _, ViaMemory as _, ViaNone as _, ViaRedis as _, ViaSharedAny as _,
            ViaSharedMemory as _, ViaSharedRedis as _,
        };
        static __TOWER_LOCK_OPTIONS: #private::Options = #options;
        let __tower_lock_client = #from_state;
        let __tower_lock_key = #key;
        #private::#run::<_, _, _, #output>(
            #parts,
            __tower_lock_client,
            &__TOWER_LOCK_OPTIONS,
            __tower_lock_key,
            move |#context_pat: #context_ty| async move #block,
        )
        .await
    };
    item.block = parse_quote!({ #body });
    Ok(quote!(#item))
}

/// `LockContext` (any path ending in it): the lock's context, supplied by the attribute.
fn is_lock_context(ty: &Type) -> bool {
    let Type::Path(path) = ty else { return false };
    path.qself.is_none()
        && path
            .path
            .segments
            .last()
            .is_some_and(|last| last.ident == "LockContext" && last.arguments.is_none())
}

/// `Extension<LockContext>` (any paths ending in them).
fn is_extension_of_lock_context(ty: &Type) -> bool {
    let Type::Path(path) = ty else { return false };
    let Some(last) = path.path.segments.last() else {
        return false;
    };
    let syn::PathArguments::AngleBracketed(args) = &last.arguments else {
        return false;
    };
    last.ident == "Extension"
        && args.args.iter().any(|arg| match arg {
            syn::GenericArgument::Type(inner) => is_lock_context(inner),
            _ => false,
        })
}

/// `T` of a `State<T>` argument.
fn state_type(ty: &Type) -> Option<Type> {
    let Type::Path(path) = ty else { return None };
    let last = path.path.segments.last()?;
    if last.ident != "State" {
        return None;
    }
    let PathArguments::AngleBracketed(args) = &last.arguments else {
        return None;
    };
    match args.args.first()? {
        GenericArgument::Type(ty) if args.args.len() == 1 => Some(ty.clone()),
        _ => None,
    }
}

/// Whether a type mentions `impl Trait`, which cannot be written as a type argument.
fn mentions_impl(tokens: TokenStream) -> bool {
    tokens.into_iter().any(|token| match token {
        TokenTree::Ident(ident) => ident == "impl",
        TokenTree::Group(group) => mentions_impl(group.stream()),
        _ => false,
    })
}
