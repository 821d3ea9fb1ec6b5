//! A small gRPC service, `bank.Bank`, written by hand: its messages with prost's derives, its
//! server and client glue on tonic's `server::Grpc` and `client::Grpc`, so that neither the
//! example nor the tests need `protoc` or a build script. What a `.proto` file would say:
//!
//! ```text
//! syntax = "proto3";
//! package bank;
//! service Bank {
//!   rpc Withdraw(Change) returns (Balance);
//!   rpc Deposit(Change) returns (Balance);
//!   rpc Statement(Account) returns (stream Balance);
//! }
//! message Change { string account = 1; int64 amount = 2; }
//! message Account { string account = 1; }
//! message Balance { string account = 1; int64 balance = 2; }
//! ```
#![allow(dead_code)]

use std::{
    convert::Infallible,
    future::Future,
    pin::Pin,
    sync::Arc,
    task::{Context, Poll},
};

use http::uri::PathAndQuery;
use tokio_stream::Stream;
use tonic::{Request, Response, Status, body::Body, server::NamedService};
use tonic_prost::ProstCodec;

/// A change to an account's balance.
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct Change {
    #[prost(string, tag = "1")]
    pub(crate) account: String,
    #[prost(int64, tag = "2")]
    pub(crate) amount: i64,
}

/// An account.
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct Account {
    #[prost(string, tag = "1")]
    pub(crate) account: String,
}

/// An account's balance.
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct Balance {
    #[prost(string, tag = "1")]
    pub(crate) account: String,
    #[prost(int64, tag = "2")]
    pub(crate) balance: i64,
}

pub(crate) const WITHDRAW: &str = "/bank.Bank/Withdraw";
pub(crate) const DEPOSIT: &str = "/bank.Bank/Deposit";
pub(crate) const STATEMENT: &str = "/bank.Bank/Statement";

/// The stream a `Statement` answers with.
pub(crate) type BalanceStream = Pin<Box<dyn Stream<Item = Result<Balance, Status>> + Send>>;

/// What a `bank.Bank` server does: one method per rpc.
pub(crate) trait Bank: Send + Sync + 'static {
    fn withdraw(
        &self,
        request: Request<Change>,
    ) -> impl Future<Output = Result<Response<Balance>, Status>> + Send;

    fn deposit(
        &self,
        request: Request<Change>,
    ) -> impl Future<Output = Result<Response<Balance>, Status>> + Send;

    fn statement(
        &self,
        request: Request<Account>,
    ) -> impl Future<Output = Result<Response<BalanceStream>, Status>> + Send;
}

/// A `bank.Bank` server: a tower service of HTTP requests, as tonic serves it.
pub(crate) struct BankServer<T>(Arc<T>);

impl<T> BankServer<T> {
    pub(crate) fn new(bank: T) -> Self {
        Self(Arc::new(bank))
    }
}

impl<T> Clone for BankServer<T> {
    fn clone(&self) -> Self {
        Self(self.0.clone())
    }
}

impl<T> NamedService for BankServer<T> {
    const NAME: &'static str = "bank.Bank";
}

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

impl<T: Bank> tower::Service<http::Request<Body>> for BankServer<T> {
    type Response = http::Response<Body>;
    type Error = Infallible;
    type Future = BoxFuture<Result<Self::Response, Infallible>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: http::Request<Body>) -> Self::Future {
        let bank = self.0.clone();
        Box::pin(async move {
            Ok(match request.uri().path() {
                WITHDRAW => {
                    let method = tower::service_fn(move |r| {
                        let bank = bank.clone();
                        async move { bank.withdraw(r).await }
                    });
                    grpc_unary(method, request).await
                }
                DEPOSIT => {
                    let method = tower::service_fn(move |r| {
                        let bank = bank.clone();
                        async move { bank.deposit(r).await }
                    });
                    grpc_unary(method, request).await
                }
                STATEMENT => {
                    let method = tower::service_fn(move |r| {
                        let bank = bank.clone();
                        async move { bank.statement(r).await }
                    });
                    let mut grpc =
                        tonic::server::Grpc::new(ProstCodec::<Balance, Account>::default());
                    grpc.server_streaming(method, request).await
                }
                _ => Status::unimplemented("no such method").into_http(),
            })
        })
    }
}

/// A unary call of a method taking a `Change`.
async fn grpc_unary<M>(method: M, request: http::Request<Body>) -> http::Response<Body>
where
    M: tonic::server::UnaryService<Change, Response = Balance>,
{
    tonic::server::Grpc::new(ProstCodec::<Balance, Change>::default()).unary(method, request).await
}

/// A `bank.Bank` client.
#[derive(Clone)]
pub(crate) struct BankClient(tonic::client::Grpc<tonic::transport::Channel>);

impl BankClient {
    /// A client of the server at `url` (`http://127.0.0.1:port`).
    pub(crate) async fn connect(url: String) -> Result<Self, tonic::transport::Error> {
        let channel = tonic::transport::Endpoint::from_shared(url)?.connect().await?;
        Ok(Self(tonic::client::Grpc::new(channel)))
    }

    async fn unary<M1, M2>(
        &mut self,
        request: Request<M1>,
        path: &'static str,
    ) -> Result<Response<M2>, Status>
    where
        M1: prost::Message + Send + Sync + 'static,
        M2: prost::Message + Default + Send + Sync + 'static,
    {
        self.0.ready().await.map_err(|e| Status::unknown(format!("not ready: {e}")))?;
        let codec = ProstCodec::<M1, M2>::default();
        self.0.unary(request, PathAndQuery::from_static(path), codec).await
    }

    pub(crate) async fn withdraw(
        &mut self,
        request: impl tonic::IntoRequest<Change>,
    ) -> Result<Response<Balance>, Status> {
        self.unary(request.into_request(), WITHDRAW).await
    }

    pub(crate) async fn deposit(
        &mut self,
        request: impl tonic::IntoRequest<Change>,
    ) -> Result<Response<Balance>, Status> {
        self.unary(request.into_request(), DEPOSIT).await
    }

    pub(crate) async fn statement(
        &mut self,
        request: impl tonic::IntoRequest<Account>,
    ) -> Result<Response<tonic::codec::Streaming<Balance>>, Status> {
        self.0.ready().await.map_err(|e| Status::unknown(format!("not ready: {e}")))?;
        let codec = ProstCodec::<Account, Balance>::default();
        self.0
            .server_streaming(request.into_request(), PathAndQuery::from_static(STATEMENT), codec)
            .await
    }
}

/// `request` with the metadata entry `name: value`.
pub(crate) fn with_metadata<T>(message: T, name: &'static str, value: &str) -> Request<T> {
    let mut request = Request::new(message);
    request.metadata_mut().insert(name, value.parse().expect("ASCII metadata"));
    request
}
