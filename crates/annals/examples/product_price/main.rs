//! Dynamic product price with a grace period (see README.md next to this file).

use annals::decide::{DecideError, Decided, Projection, Retry};
use annals::{NewEvent, Options, Query, QueryItem, Store};

#[derive(Clone, Default, Debug)]
pub struct Prices {
    pub current: Option<u64>,
    pub previous: Option<u64>,
    /// When the current price was set, microseconds since the epoch.
    pub changed_at_us: u64,
}

fn prices(product: &str) -> impl annals::decide::Project<State = Prices> {
    Projection::new(
        Query::item(
            QueryItem::types(["ProductPriceChanged"]).and_tags([format!("product:{product}")]),
        ),
        Prices::default(),
        |p: &mut Prices, event| {
            let price = std::str::from_utf8(event.data())
                .ok()
                .and_then(|d| d.parse().ok());
            p.previous = p.current;
            p.current = price;
            p.changed_at_us = event.appended_at_us();
        },
    )
}

pub fn change_price(store: &Store, product: &str, price: u64) -> Result<u64, annals::AppendError> {
    store.append(
        &[NewEvent::new("ProductPriceChanged", price.to_string())
            .tag(format!("product:{product}"))],
        None,
    )
}

/// Places an order at `displayed` price at time `now_us`, with `grace_us` of grace after a
/// change.
pub fn order(
    store: &Store,
    product: &str,
    displayed: u64,
    now_us: u64,
    grace_us: u64,
) -> Result<Decided, DecideError<String>> {
    store.decide_and_append(&prices(product), Retry::default(), |p| {
        let current = p.current.ok_or_else(|| format!("{product} has no price"))?;
        let fresh_previous =
            p.previous == Some(displayed) && now_us.saturating_sub(p.changed_at_us) <= grace_us;
        if displayed != current && !fresh_previous {
            return Err(format!(
                "price {displayed} is not valid (current {current})"
            ));
        }
        Ok(vec![
            NewEvent::new("OrderPlaced", displayed.to_string()).tag(format!("product:{product}"))
        ])
    })
}

#[allow(dead_code)]
fn main() {
    let store = Store::open_in_memory(Options::default()).expect("a memory store");
    let now = || {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_micros() as u64)
    };
    change_price(&store, "p1", 100).expect("price");
    change_price(&store, "p1", 120).expect("price");
    let grace = 60_000_000;
    println!(
        "at the old price, just after the change: {:?}",
        order(&store, "p1", 100, now(), grace).map(|d| d.position)
    );
    println!(
        "at the old price, much later: {:?}",
        order(&store, "p1", 100, now() + 2 * grace, grace).map(|d| d.position)
    );
}
