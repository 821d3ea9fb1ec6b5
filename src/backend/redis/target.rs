//! Where the backend finds its Redis server: a fixed address, or the master Sentinel names.
//! Every new connection (pooled or pub/sub) asks for a client, so after a failover a broken
//! connection's replacement goes to the new master (redis-rs checks its `ROLE`).

use std::fmt;

use redis::{Client, RedisResult};

/// The server behind a backend.
pub(super) enum Target {
    Node(Client),
    /// The master of a Sentinel-monitored group, looked up again for each new connection.
    #[cfg(feature = "sentinel")]
    Sentinel {
        sentinels: tokio::sync::Mutex<redis::sentinel::SentinelClient>,
        /// The group's name.
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

    /// The server for messages: its address, or the Sentinel group's name.
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
        f.write_str(&self.describe())
    }
}
