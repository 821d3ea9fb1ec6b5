//! The `#[locked(...)]` attribute of [tower-lock](https://docs.rs/tower-lock): an axum handler
//! that holds a distributed lock while it runs. Use it through `tower_lock::locked` (feature
//! `macros`); the documentation and examples are there.

mod duration;
mod expand;
mod options;
mod template;

use proc_macro::TokenStream;

/// Holds a lock, named by a template over the handler's bindings, while the handler runs.
///
/// `#[locked(key = "account:{id}", wait = "2s")]` on an `async fn` axum handler takes the lock
/// `account:<id>` (the same on every route: the text names the resource, as a `LockLayer`
/// with `key::path_param("id").prefixed("account:")` would) before the body runs, keeps it while the body runs, and releases it before the response
/// leaves. Lock failures answer like the layer: 423 with `Retry-After` after `wait`, 503 when
/// the backend is down or the lock is lost, 400 for an invalid key.
///
/// | option | meaning | default |
/// |---|---|---|
/// | `key = "..."` | template: `{name}`, `{name.field}`, `{{`/`}}` for braces; names are the handler's bindings | required, or `keys` |
/// | `keys = ["...", "..."]` | several templates: all their locks are held together, taken in one canonical order (no deadlock between requests naming them in opposite orders), all or nothing within `wait`; a `Json(t)` binding makes body fields usable, as in `"account:{t.from}"` | instead of `key` |
/// | `wait = "2s"` | how long to wait before answering 423 (`ms`, `s`, `m`, `h`) | `"5s"` |
/// | `lease = "10s"` | fixed lease; `"watchdog"` or `"watchdog(10s)"` for a renewed one | `"watchdog"` (5 s) |
/// | `fair` / `read` / `write` | fair lock; read or write side of a read-write lock | exclusive |
/// | `fencing` | issue a fencing token (see `LockContext::fencing_token`) | off |
/// | `on_lost = "abort"` / `"continue"` | lock lost mid-handler: cancel it with 503, or let it finish | `"abort"` |
/// | `name = "..."` | namespace of the key | a key with text of its own (`account:{id}`): none; a lone path parameter (`{id}`): the route up to it (`/accounts/:id`), as `key::path_param("id")` on a layer; else the route |
///
/// The lock client is the `LockLayer`'s the handler runs under, else an `AnyLockClient` in the
/// request's extensions (add `Extension(AnyLockClient::from(locks))`), else from the handler's
/// `State<T>` when
/// `AnyLockClient`, `LockClient<MemoryBackend>` or `LockClient<RedisBackend>` implements
/// `FromRef<T>`. Without one the handler answers 500 and logs how to provide it.
///
/// An argument whose type is written `LockContext` receives the held lock's context (fencing
/// token, lost signal); the attribute supplies it, so it is not an extractor. Under a
/// `LockLayer` taking the same lock, the handler re-enters it.
///
/// The handler keeps its number of arguments (the attribute's extractor takes the place of the
/// `LockContext` argument, or is paired with the first one), so `#[debug_handler]` works above
/// or below it; below is better, as it then checks the handler axum will call, and it is the
/// only order that accepts a `LockContext` argument or a handler without arguments.
#[proc_macro_attribute]
pub fn locked(attr: TokenStream, item: TokenStream) -> TokenStream {
    let item_tokens = proc_macro2::TokenStream::from(item.clone());
    let mut options = options::Options::new();
    let parser = syn::meta::parser(|meta| options.parse(&meta));
    let result = syn::parse::Parser::parse(parser, attr)
        .and_then(|()| syn::parse::<syn::ItemFn>(item))
        .and_then(|item| expand::expand(&options, item));
    match result {
        Ok(tokens) => tokens.into(),
        // The handler stays as written, so the only error is the attribute's.
        Err(error) => {
            let error = error.to_compile_error();
            quote::quote!(#error #item_tokens).into()
        }
    }
}
