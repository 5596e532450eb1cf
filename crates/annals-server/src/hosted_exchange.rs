//! The exchange a server hosts, and the channel its durable outputs fan out through. The root
//! starts it, the handlers' shared state holds it, and the exchange's routes (`exchange.rs`)
//! answer from it; it sits below both, so that the state does not import the routes that
//! import the state.

use std::sync::Arc;

use annals_exchange::{Exchange, Mode, Output};
use tokio::sync::broadcast;

/// Batches of outputs a slow stream may fall behind before it is told it lagged and closed.
const MARKET_CHANNEL_BATCHES: usize = 4_096;

/// The exchange a server hosts, and the channel its durable outputs fan out through.
pub(crate) struct Hosted {
    pub exchange: Exchange,
    pub outputs: broadcast::Sender<Arc<Published>>,
}

/// One durable batch's outputs; the first is numbered `first`.
pub(crate) struct Published {
    pub first: u64,
    pub outputs: Vec<Output>,
}

impl Hosted {
    /// Recovers and starts the exchange on a blocking thread.
    pub async fn start(
        config: &crate::config::ExchangeConfig,
        store: Arc<annals::Store>,
    ) -> Result<Hosted, String> {
        config.check(store.durability())?;
        let (outputs, _) = broadcast::channel(MARKET_CHANNEL_BATCHES);
        let sender = outputs.clone();
        let sink: annals_exchange::Sink = Arc::new(move |first, outputs| {
            // No receiver is not an error: nobody is watching.
            let _ = sender.send(Arc::new(Published { first, outputs }));
        });
        let options = annals_exchange::ServiceOptions {
            mode: config.mode(),
            symbols: config.symbols(),
            snapshot_every: config.snapshot_every,
            queue_depth: config.queue_depth,
            ..annals_exchange::ServiceOptions::default()
        };
        let journal = (config.mode() != Mode::Memory).then_some(store);
        let exchange = tokio::task::spawn_blocking(move || Exchange::start(journal, options, sink))
            .await
            .map_err(|e| e.to_string())?
            .map_err(|e| format!("cannot start the exchange: {e}"))?;
        Ok(Hosted { exchange, outputs })
    }
}
