//! Where the backend finds the Redis server it talks to: a fixed address, or the master that
//! Sentinel currently names.
//!
//! Every new connection (pooled or pub/sub) asks the target for a client, so once a connection
//! breaks after a failover, its replacement goes to the new master. With Sentinel, redis-rs
//! checks that the address it is given answers `ROLE` as a master before handing it out.

use std::fmt;

use redis::{Client, RedisResult};

/// The server behind a backend.
pub(super) enum Target {
    /// One fixed server.
    Node(Client),
    /// The master of a Sentinel-monitored group, looked up again for each new connection.
    #[cfg(feature = "sentinel")]
    Sentinel {
        /// The Sentinel client; queries go through one at a time.
        sentinels: tokio::sync::Mutex<redis::sentinel::SentinelClient>,
        /// The monitored group's name, for logs and `Debug`.
        name: String,
    },
}

impl Target {
    /// A client for the server to connect to now.
    pub(super) async fn client(&self) -> RedisResult<Client> {
        match self {
            Self::Node(client) => Ok(client.clone()),
            #[cfg(feature = "sentinel")]
            Self::Sentinel { sentinels, name } => {
                let client = sentinels.lock().await.async_get_client().await;
                if let Err(error) = &client {
                    tracing::warn!(master = %name, error = %format_args!("{error:#}"), "sentinels named no reachable master");
                }
                client
            }
        }
    }
}

impl Target {
    /// The server for error messages: its address, or the Sentinel group's name.
    pub(super) fn describe(&self) -> String {
        match self {
            Self::Node(client) => client.get_connection_info().addr().to_string(),
            #[cfg(feature = "sentinel")]
            Self::Sentinel { name, .. } => format!("the master `{name}` the sentinels name"),
        }
    }
}

impl fmt::Debug for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Connection info may carry a password: show only the address.
        match self {
            Self::Node(client) => f
                .debug_tuple("Node")
                .field(client.get_connection_info().addr())
                .finish(),
            #[cfg(feature = "sentinel")]
            Self::Sentinel { name, .. } => {
                f.debug_struct("Sentinel").field("master", name).finish()
            }
        }
    }
}
