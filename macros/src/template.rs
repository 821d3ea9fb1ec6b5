//! The key template: `"doc:{doc_id}:{user.tenant}"` becomes a `format!` over the handler's
//! bindings, checked against the bindings its arguments declare.

use proc_macro2::{Ident, TokenStream};
use quote::quote_spanned;
use syn::{LitStr, Member, Pat};

/// The `format!` call that builds the key, or an error pointing at the template.
pub(crate) fn key_expr(template: &LitStr, bindings: &[Ident]) -> syn::Result<TokenStream> {
    let span = template.span();
    let text = template.value();
    let mut format = String::with_capacity(text.len());
    // The key itself, for a template without placeholders.
    let mut plain = String::with_capacity(text.len());
    let mut args = Vec::new();
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '{' if chars.peek() == Some(&'{') => {
                chars.next();
                format.push_str("{{");
                plain.push('{');
            }
            '}' if chars.peek() == Some(&'}') => {
                chars.next();
                format.push_str("}}");
                plain.push('}');
            }
            '{' => {
                let mut inner = String::new();
                loop {
                    match chars.next() {
                        Some('}') => break,
                        Some(c) => inner.push(c),
                        None => {
                            return Err(syn::Error::new(
                                span,
                                "unclosed `{` in the key template (write `{{` for a literal brace)",
                            ));
                        }
                    }
                }
                args.push(placeholder(template, inner.trim(), bindings)?);
                format.push_str("{}");
            }
            '}' => {
                return Err(syn::Error::new(
                    span,
                    "unmatched `}` in the key template (write `}}` for a literal brace)",
                ));
            }
            c => {
                format.push(c);
                plain.push(c);
            }
        }
    }
    if args.is_empty() {
        let plain = LitStr::new(&plain, span);
        return Ok(quote_spanned! {span=> ::std::string::String::from(#plain) });
    }
    let format = LitStr::new(&format, span);
    Ok(quote_spanned! {span=> ::tower_lock::__private::format!(#format #(, #args)*) })
}

/// The run-time `Resource` a template names (see `tower_lock::__private::Resource`): text of
/// its own names the resource; a lone `{binding}` is a path parameter's; anything else leaves
/// the lock to the route.
pub(crate) fn resource_tokens(text: &str) -> TokenStream {
    let private = quote::quote!(::tower_lock::__private);
    let lone =
        text.strip_prefix('{').and_then(|rest| rest.strip_suffix('}')).map(str::trim).filter(
            |inner| !inner.is_empty() && inner.chars().all(|c| c.is_alphanumeric() || c == '_'),
        );
    if let Some(param) = lone {
        return quote::quote!(#private::Resource::PathParam(#param));
    }
    // Text outside placeholders (a literal `{{` or `}}` counts as text).
    let mut depth = 0usize;
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '{' if chars.peek() == Some(&'{') && depth == 0 => {
                return quote::quote!(#private::Resource::Named);
            }
            '}' if chars.peek() == Some(&'}') && depth == 0 => {
                return quote::quote!(#private::Resource::Named);
            }
            '{' => depth += 1,
            '}' => depth = depth.saturating_sub(1),
            _ if depth == 0 => return quote::quote!(#private::Resource::Named),
            _ => {}
        }
    }
    quote::quote!(#private::Resource::Route)
}

/// `name` or `name.field.0`: a reference to a binding or to a field of one.
fn placeholder(template: &LitStr, inner: &str, bindings: &[Ident]) -> syn::Result<TokenStream> {
    let span = template.span();
    let mut parts = inner.split('.');
    let root = parts.next().unwrap_or_default();
    if root.is_empty() {
        return Err(syn::Error::new(
            span,
            "empty `{}` in the key template: name a binding of the handler, as in `{id}`",
        ));
    }
    let Some(binding) = bindings.iter().find(|b| *b == root) else {
        let known = if bindings.is_empty() {
            "the handler binds no names".to_owned()
        } else {
            let names: Vec<String> = bindings.iter().map(|b| format!("`{b}`")).collect();
            format!("its bindings are {}", names.join(", "))
        };
        return Err(syn::Error::new(
            span,
            format!("`{{{inner}}}`: the handler has no binding named `{root}`; {known}"),
        ));
    };
    let root = Ident::new(&binding.to_string(), span);
    let mut fields = Vec::new();
    for field in parts {
        let member = if !field.is_empty() && field.bytes().all(|b| b.is_ascii_digit()) {
            Member::Unnamed(syn::Index {
                index: field.parse().map_err(|_| bad_field(template, inner))?,
                span,
            })
        } else {
            let ident: Ident = syn::parse_str(field).map_err(|_| bad_field(template, inner))?;
            Member::Named(Ident::new(&ident.to_string(), span))
        };
        fields.push(member);
    }
    Ok(quote_spanned! {span=> &#root #(.#fields)* })
}

fn bad_field(template: &LitStr, inner: &str) -> syn::Error {
    syn::Error::new(
        template.span(),
        format!("`{{{inner}}}`: expected a binding or a field path such as `{{user.tenant}}`"),
    )
}

/// Every name a pattern binds: `Path((doc_id, _))` binds `doc_id`.
pub(crate) fn bindings(pat: &Pat, out: &mut Vec<Ident>) {
    match pat {
        Pat::Ident(p) => {
            out.push(p.ident.clone());
            if let Some((_, sub)) = &p.subpat {
                bindings(sub, out);
            }
        }
        Pat::Tuple(p) => p.elems.iter().for_each(|p| bindings(p, out)),
        Pat::TupleStruct(p) => p.elems.iter().for_each(|p| bindings(p, out)),
        Pat::Struct(p) => p.fields.iter().for_each(|f| bindings(&f.pat, out)),
        Pat::Slice(p) => p.elems.iter().for_each(|p| bindings(p, out)),
        Pat::Reference(p) => bindings(&p.pat, out),
        Pat::Paren(p) => bindings(&p.pat, out),
        Pat::Type(p) => bindings(&p.pat, out),
        // Every alternative binds the same names.
        Pat::Or(p) => {
            if let Some(first) = p.cases.first() {
                bindings(first, out);
            }
        }
        _ => {}
    }
}
