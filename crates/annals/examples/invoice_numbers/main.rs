//! Invoice numbers (see README.md next to this file).

use annals::decide::{DecideError, Decided, Project, Projection, Retry};
use annals::{NewEvent, Query, QueryItem, Store};

/// The last invoice number issued; only the latest `InvoiceCreated` matters, so the decision
/// reads one event, backwards.
pub fn last_number() -> impl Project<State = u64> {
    Projection::last(
        Query::item(QueryItem::types(["InvoiceCreated"])),
        0u64,
        |n: &mut u64, event| {
            *n = std::str::from_utf8(event.data())
                .ok()
                .and_then(|d| d.parse().ok())
                .unwrap_or(*n)
        },
    )
}

/// An invoice created for `customer`: its number and the decision's outcome.
#[derive(Debug)]
pub struct Created {
    pub number: u64,
    pub decided: Decided,
}

/// Creates the next invoice, numbered one above the last. Under contention every creator but
/// one per round meets a failed condition and decides again; `retry` bounds how often.
pub fn create_invoice(
    store: &Store,
    customer: &str,
    retry: Retry,
) -> Result<Created, DecideError<std::convert::Infallible>> {
    let mut number = 0;
    let decided = store.decide_and_append(&last_number(), retry, |last| {
        number = last + 1;
        Ok(vec![NewEvent::new("InvoiceCreated", number.to_string())
            .tag(format!("invoice:{number}"))
            .tag(format!("customer:{customer}"))])
    })?;
    Ok(Created { number, decided })
}

#[allow(dead_code)]
fn main() {
    let store = std::sync::Arc::new(
        Store::open_in_memory(annals::Options::default()).expect("a memory store"),
    );
    let threads: Vec<_> = (0..4)
        .map(|t| {
            let store = store.clone();
            std::thread::spawn(move || {
                (0..3)
                    .map(|_| {
                        let created = create_invoice(&store, &format!("c{t}"), Retry::default())
                            .expect("created");
                        (created.number, created.decided.attempts)
                    })
                    .collect::<Vec<_>>()
            })
        })
        .collect();
    for (t, thread) in threads.into_iter().enumerate() {
        for (number, attempts) in thread.join().expect("a creator") {
            println!("customer c{t}: invoice {number} ({attempts} attempts)");
        }
    }
}
