//! Annals exchange: an order-matching engine for many symbols, deterministic (time and ids
//! are inputs), with no I/O in the matcher, meant to be journaled through the Annals store.
//!
//! ```
//! use annals_exchange::*;
//!
//! let mut engine = Engine::new(&[SymbolSpec { tick: 1, lot: 1 }]);
//! let mut out = Vec::new();
//! let order = |id, side, price, qty| Command::Place(Place {
//!     id, client_id: id, account: id, symbol: 0, side, kind: Kind::Limit, price, qty,
//!     stp: Stp::CancelNewest,
//! });
//! engine.apply(1, &order(1, Side::Sell, 101, 5), &mut out);
//! engine.apply(2, &order(2, Side::Buy, 102, 3), &mut out);
//! // The buyer takes 3 at the resting seller's price.
//! assert!(out.contains(&Report::Trade {
//!     symbol: 0, price: 101, qty: 3, maker: 1, taker: 2, taker_side: Side::Buy, time: 2,
//! }));
//! assert_eq!(engine.bbo(0).ask, Some((101, 2)));
//! ```

pub mod codec;
mod engine;
#[cfg(feature = "hosted")]
pub mod hosted;
mod journal;
pub mod recovery;
pub mod scenario;
mod service;
mod types;
mod wire;

pub use engine::Engine;
pub use journal::{ExchangeError, Mode, Released, Sequencer, SequencerOptions};
pub use recovery::{recover, Recovered, Snapshot, Snapshots};
pub use service::{Exchange, Executed, Output, ServiceOptions, ServiceStats, Sink, StartReport};
pub use types::*;
pub use wire::DecodeError;
