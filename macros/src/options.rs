//! The attribute's arguments: `key = "..."` and the lock options, checked at compile time.

use proc_macro2::{Span, TokenStream};
use quote::quote;
use syn::{LitStr, meta::ParseNestedMeta};

use crate::duration::parse_duration;

/// The shortest lease the engine accepts.
const MIN_LEASE_MS: u64 = 3;

/// The default watchdog lease, the same as the layer's.
const DEFAULT_WATCHDOG_MS: u64 = 30_000;

const KNOWN: &str = "`key`, `keys`, `wait`, `lease`, `fair`, `read`, `write`, `permits`, `fencing`, \
                     `on_lost`, `name`";

/// Which lock the handler takes.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    Exclusive,
    Fair,
    Read,
    Write,
    /// A permit of a semaphore of this many permits.
    Permits(u32),
}

/// How long the lock lives without renewal.
enum Lease {
    Fixed(u64),
    Watchdog(u64),
}

/// Everything the attribute was given.
pub(crate) struct Options {
    pub(crate) key: Option<LitStr>,
    /// `keys = ["...", "..."]`: a set of locks taken together.
    pub(crate) keys: Option<Vec<LitStr>>,
    wait_ms: Option<u64>,
    lease: Option<Lease>,
    kind: Option<(Kind, Span)>,
    fencing: bool,
    name: Option<LitStr>,
    abort_on_lost: Option<bool>,
}

impl Options {
    pub(crate) fn new() -> Self {
        Self {
            key: None,
            keys: None,
            wait_ms: None,
            lease: None,
            kind: None,
            fencing: false,
            name: None,
            abort_on_lost: None,
        }
    }

    /// Parses one `name` or `name = "value"` argument.
    pub(crate) fn parse(&mut self, meta: &ParseNestedMeta<'_>) -> syn::Result<()> {
        let Some(ident) = meta.path.get_ident() else {
            return Err(meta.error(format!("unknown option; expected one of {KNOWN}")));
        };
        let span = ident.span();
        match ident.to_string().as_str() {
            "key" => {
                let key: LitStr = meta.value()?.parse()?;
                if key.value().is_empty() {
                    return Err(syn::Error::new(key.span(), "the key template is empty"));
                }
                if self.keys.is_some() {
                    return Err(key_and_keys(span));
                }
                set(&mut self.key, key, span, "key")
            }
            "keys" => {
                let array: syn::ExprArray = meta.value()?.parse()?;
                let mut keys = Vec::with_capacity(array.elems.len());
                for elem in &array.elems {
                    match elem {
                        syn::Expr::Lit(syn::ExprLit { lit: syn::Lit::Str(key), .. })
                            if !key.value().is_empty() =>
                        {
                            keys.push(key.clone())
                        }
                        syn::Expr::Lit(syn::ExprLit { lit: syn::Lit::Str(key), .. }) => {
                            return Err(syn::Error::new(key.span(), "the key template is empty"));
                        }
                        other => {
                            return Err(syn::Error::new_spanned(
                                other,
                                "`keys` takes string templates, as in `keys = [\"account:{t.from}\", \"account:{t.to}\"]`",
                            ));
                        }
                    }
                }
                if keys.is_empty() {
                    return Err(syn::Error::new_spanned(
                        &array,
                        "`keys` is empty: name at least one template, as in `keys = [\"account:{t.from}\", \"account:{t.to}\"]`",
                    ));
                }
                if self.key.is_some() {
                    return Err(key_and_keys(span));
                }
                set(&mut self.keys, keys, span, "keys")
            }
            "wait" => {
                let lit: LitStr = meta.value()?.parse()?;
                let ms = parse_duration(&lit)?;
                set(&mut self.wait_ms, ms, span, "wait")
            }
            "lease" => {
                let lit: LitStr = meta.value()?.parse()?;
                let lease = parse_lease(&lit)?;
                set(&mut self.lease, lease, span, "lease")
            }
            "fair" => self.set_kind(meta, Kind::Fair, span),
            "read" => self.set_kind(meta, Kind::Read, span),
            "write" => self.set_kind(meta, Kind::Write, span),
            "permits" => {
                let lit: syn::LitInt = meta.value()?.parse()?;
                let permits: u32 = lit.base10_parse()?;
                if permits == 0 {
                    return Err(syn::Error::new(
                        lit.span(),
                        "`permits` must be at least 1: with none, no request could ever run",
                    ));
                }
                if self.fencing {
                    return Err(fencing_and_permits(span));
                }
                self.set_kind_once(Kind::Permits(permits), span)
            }
            "fencing" => {
                flag(meta)?;
                if self.fencing {
                    return Err(syn::Error::new(span, "duplicate option `fencing`"));
                }
                if matches!(self.kind, Some((Kind::Permits(_), _))) {
                    return Err(fencing_and_permits(span));
                }
                self.fencing = true;
                Ok(())
            }
            "on_lost" => {
                let lit: LitStr = meta.value()?.parse()?;
                let abort = match lit.value().as_str() {
                    "abort" => true,
                    "continue" => false,
                    other => {
                        return Err(syn::Error::new(
                            lit.span(),
                            format!(
                                "invalid `on_lost` value `{other}`: expected \"abort\" or \"continue\""
                            ),
                        ));
                    }
                };
                set(&mut self.abort_on_lost, abort, span, "on_lost")
            }
            "name" => {
                let name: LitStr = meta.value()?.parse()?;
                set(&mut self.name, name, span, "name")
            }
            other => Err(syn::Error::new(
                span,
                format!("unknown option `{other}`; expected one of {KNOWN}"),
            )),
        }
    }

    fn set_kind(&mut self, meta: &ParseNestedMeta<'_>, kind: Kind, span: Span) -> syn::Result<()> {
        flag(meta)?;
        self.set_kind_once(kind, span)
    }

    fn set_kind_once(&mut self, kind: Kind, span: Span) -> syn::Result<()> {
        match self.kind {
            None => {
                self.kind = Some((kind, span));
                Ok(())
            }
            Some((old, _)) if kind_name(old) == kind_name(kind) => {
                Err(syn::Error::new(span, format!("duplicate option `{}`", kind_name(kind))))
            }
            Some((old, _)) => Err(syn::Error::new(
                span,
                format!(
                    "`{}` cannot be combined with `{}`: {}",
                    kind_name(kind),
                    kind_name(old),
                    "choose one of `fair` (exclusive, FIFO), `read` (shared), `write` (exclusive) or \
                     `permits = N` (N at a time)"
                ),
            )),
        }
    }

    /// The `Options` value the expansion passes to the run-time support.
    pub(crate) fn to_tokens(&self) -> TokenStream {
        let private = quote!(::tower_lock::__private);
        let kind = match self.kind.map_or(Kind::Exclusive, |(kind, _)| kind) {
            Kind::Exclusive => quote!(#private::LockKind::Exclusive),
            Kind::Fair => quote!(#private::LockKind::Fair),
            Kind::Read => quote!(#private::LockKind::Read),
            Kind::Write => quote!(#private::LockKind::Write),
            Kind::Permits(_) => quote!(#private::LockKind::Semaphore),
        };
        let permits = match self.kind {
            Some((Kind::Permits(permits), _)) => permits,
            _ => 0,
        };
        // Unset: the client's, as for `LockLayer`.
        let wait = match self.wait_ms {
            Some(ms) => quote!(::core::option::Option::Some(#private::Duration::from_millis(#ms))),
            None => quote!(::core::option::Option::None),
        };
        let lease = match self.lease {
            Some(Lease::Fixed(ms)) => quote!(::core::option::Option::Some(
                #private::Lease::fixed(#private::Duration::from_millis(#ms))
            )),
            Some(Lease::Watchdog(ms)) => quote!(::core::option::Option::Some(
                #private::Lease::watchdog(#private::Duration::from_millis(#ms))
            )),
            None => quote!(::core::option::Option::None),
        };
        let fencing = self.fencing;
        let name = match &self.name {
            Some(name) => quote!(::core::option::Option::Some(#name)),
            None => quote!(::core::option::Option::None),
        };
        let abort_on_lost = self.abort_on_lost.unwrap_or(true);
        let resource = match &self.keys {
            // A set's locks share one namespace: the one all its templates name, else the
            // route's.
            Some(keys) => {
                let mut resources = keys
                    .iter()
                    .map(|key| crate::template::resource_tokens(&key.value()).to_string());
                let first = resources.next().unwrap_or_default();
                if resources.all(|resource| resource == first) {
                    crate::template::resource_tokens(&keys[0].value())
                } else {
                    quote!(#private::Resource::Route)
                }
            }
            None => crate::template::resource_tokens(
                &self.key.as_ref().map(LitStr::value).unwrap_or_default(),
            ),
        };
        let template = match (&self.key, &self.keys) {
            (Some(key), _) => key.value(),
            (None, Some(keys)) => keys.iter().map(LitStr::value).collect::<Vec<_>>().join(", "),
            (None, None) => String::new(),
        };
        quote! {
            #private::Options {
                wait: #wait,
                lease: #lease,
                kind: #kind,
                permits: #permits,
                fencing: #fencing,
                name: #name,
                resource: #resource,
                abort_on_lost: #abort_on_lost,
                template: #template,
                announced: #private::Announced::new(),
            }
        }
    }
}

fn kind_name(kind: Kind) -> &'static str {
    match kind {
        Kind::Exclusive => "exclusive",
        Kind::Fair => "fair",
        Kind::Read => "read",
        Kind::Write => "write",
        Kind::Permits(_) => "permits",
    }
}

/// `fencing` asks for a token a semaphore's shared permits do not carry.
fn fencing_and_permits(span: Span) -> syn::Error {
    syn::Error::new(
        span,
        "`fencing` cannot be combined with `permits`: permits are shared, so they carry no \
         fencing token",
    )
}

/// A flag option takes no value.
fn flag(meta: &ParseNestedMeta<'_>) -> syn::Result<()> {
    if meta.input.peek(syn::Token![=]) || meta.input.peek(syn::token::Paren) {
        return Err(meta.error("this option is a flag and takes no value"));
    }
    Ok(())
}

fn set<T>(slot: &mut Option<T>, value: T, span: Span, name: &str) -> syn::Result<()> {
    if slot.is_some() {
        return Err(syn::Error::new(span, format!("duplicate option `{name}`")));
    }
    *slot = Some(value);
    Ok(())
}

/// `"10s"` (a fixed lease), `"watchdog"` (renewed, 5 s by default) or `"watchdog(10s)"`.
fn parse_lease(lit: &LitStr) -> syn::Result<Lease> {
    let value = lit.value();
    let value = value.trim();
    let lease = if value == "watchdog" {
        Lease::Watchdog(DEFAULT_WATCHDOG_MS)
    } else if let Some(inner) =
        value.strip_prefix("watchdog(").and_then(|rest| rest.strip_suffix(')'))
    {
        Lease::Watchdog(parse_duration(&LitStr::new(inner, lit.span()))?)
    } else {
        Lease::Fixed(parse_duration(lit)?)
    };
    let (Lease::Fixed(ms) | Lease::Watchdog(ms)) = lease;
    if ms < MIN_LEASE_MS {
        return Err(syn::Error::new(
            lit.span(),
            format!("a lease must be at least {MIN_LEASE_MS}ms"),
        ));
    }
    Ok(lease)
}

/// A missing `key` names what to write.
pub(crate) fn missing_key(span: Span) -> syn::Error {
    syn::Error::new(
        span,
        "missing `key = \"...\"`: a template over the handler's bindings, as in `key = \"account:{id}\"` \
         (or `keys = [\"...\", \"...\"]` for several locks)",
    )
}

/// `key` and `keys` together.
fn key_and_keys(span: Span) -> syn::Error {
    syn::Error::new(
        span,
        "`key` and `keys` cannot be combined: use `key = \"...\"` for one lock, or put every \
         template into `keys = [\"...\", \"...\"]` for several",
    )
}
