//! Prevent record duplication with an idempotency token (see README.md next to this file).

use annals::decide::{DecideError, Projection, Retry};
use annals::{NewEvent, Options, Query, QueryItem, Store};

/// The order already recorded for `token`, if any.
fn recorded(token: &str) -> impl annals::decide::Project<State = Option<String>> {
    Projection::new(
        Query::item(QueryItem::tags([format!("idempotency:{token}")])),
        None,
        |order: &mut Option<String>, event| {
            *order = Some(String::from_utf8_lossy(event.data()).into_owned());
        },
    )
}

/// The outcome of a "place order" request.
#[derive(Debug, PartialEq, Eq)]
pub enum Placed {
    /// Recorded now, at this position.
    New(u64),
    /// Already recorded by an earlier copy of the request: that order's id.
    Duplicate(String),
}

pub fn place_order(store: &Store, token: &str, order: &str) -> Result<Placed, DecideError<String>> {
    let mut duplicate = None;
    let result = store.decide_and_append(&recorded(token), Retry::default(), |recorded| {
        if let Some(existing) = recorded {
            duplicate = Some(existing.clone());
            // Nothing to append: answer with the original.
            return Err(existing.clone());
        }
        Ok(vec![NewEvent::new("OrderPlaced", order.to_string())
            .tag(format!("idempotency:{token}"))
            .tag(format!("order:{order}"))])
    });
    match (result, duplicate) {
        (Ok(decided), _) => Ok(Placed::New(decided.position)),
        (Err(DecideError::Rejected(_)), Some(original)) => Ok(Placed::Duplicate(original)),
        (Err(e), _) => Err(e),
    }
}

#[allow(dead_code)]
fn main() {
    let store = Store::open_in_memory(Options::default()).expect("a memory store");
    println!("first request:  {:?}", place_order(&store, "t-1", "o-100"));
    println!("retried request: {:?}", place_order(&store, "t-1", "o-101"));
}
