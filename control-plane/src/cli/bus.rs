//! The bus flags of `plexsphere serve` (`--nats-url`, `--nats-stream-replicas`) and starting
//! the bus they ask for: NATS JetStream between replicas with the poller as its safety net;
//! without NATS the in-process bus, plus the poller when the database is Postgres (other
//! replicas may share it).

use std::sync::Arc;

use clap::Args;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use super::failure::Failure;
use crate::bus::nats::{NatsBus, NatsConfig, NatsTasks};
use crate::bus::poll::{self, Link};
use crate::bus::{EventBus, InProcessBus};
use crate::store::Store;

#[derive(Debug, Clone, Default, Args)]
pub struct BusArgs {
    /// NATS servers of the event bus between replicas (`nats://host:port`; comma-separated or
    /// repeated for a cluster). Without it, events reach other replicas sharing a Postgres by
    /// polling it every second.
    #[arg(
        long = "nats-url",
        env = "PLEXSPHERE_NATS_URL",
        value_delimiter = ',',
        value_name = "URL"
    )]
    pub nats_urls: Vec<String>,
    /// JetStream replicas of the bus's stream (1-5); default: 3 when --nats-url names three
    /// or more servers, else 1.
    #[arg(long, env = "PLEXSPHERE_NATS_STREAM_REPLICAS")]
    pub nats_stream_replicas: Option<usize>,
}

impl BusArgs {
    /// The NATS config, checked, or `None` without `--nats-url`.
    pub(super) fn config(&self) -> Result<Option<NatsConfig>, Failure> {
        if self.nats_urls.is_empty() {
            if self.nats_stream_replicas.is_some() {
                return Err(Failure::Config(
                    "--nats-stream-replicas needs --nats-url".into(),
                ));
            }
            return Ok(None);
        }
        let config = NatsConfig {
            urls: self.nats_urls.clone(),
            stream_replicas: self
                .nats_stream_replicas
                .unwrap_or(if self.nats_urls.len() >= 3 { 3 } else { 1 }),
            client_name: format!("plexsphere-{}", std::process::id()),
        };
        config.check().map_err(|e| Failure::Config(e.to_string()))?;
        Ok(Some(config))
    }
}

/// The running bus's tasks; stopped on drop.
pub(super) struct BusTasks {
    _nats: Option<NatsTasks>,
    /// Without NATS: the constant `Link::None` the poller reads.
    _link: Option<watch::Sender<Link>>,
    poller: Option<JoinHandle<()>>,
}

impl Drop for BusTasks {
    fn drop(&mut self) {
        if let Some(p) = &self.poller {
            p.abort();
        }
    }
}

/// Starts the bus `config` asks for over `store`.
pub(super) async fn start(
    config: Option<NatsConfig>,
    store: &Store,
    postgres: bool,
) -> Result<(Arc<dyn EventBus>, BusTasks), Failure> {
    let local = Arc::new(InProcessBus::new());
    match config {
        Some(config) => {
            let (bus, tasks) = NatsBus::start(&config, local.clone())
                .await
                .map_err(|e| Failure::Config(e.to_string()))?;
            tracing::info!(nats = %config.urls.join(","), stream_replicas = config.stream_replicas, "event bus: NATS JetStream, with the database poller as its safety net");
            let poller = poll::spawn(store.clone(), local, tasks.link.clone());
            Ok((
                Arc::new(bus),
                BusTasks {
                    _nats: Some(tasks),
                    _link: None,
                    poller: Some(poller),
                },
            ))
        }
        None if postgres => {
            tracing::info!(
                every_secs = poll::POLL_WITHOUT_BUS.as_secs(),
                "event bus: in-process, and polling the shared Postgres for other replicas' events (no --nats-url)"
            );
            let (link_tx, link) = watch::channel(Link::None);
            let poller = poll::spawn(store.clone(), local.clone(), link);
            Ok((
                local,
                BusTasks {
                    _nats: None,
                    _link: Some(link_tx),
                    poller: Some(poller),
                },
            ))
        }
        None => Ok((
            local,
            BusTasks {
                _nats: None,
                _link: None,
                poller: None,
            },
        )),
    }
}
