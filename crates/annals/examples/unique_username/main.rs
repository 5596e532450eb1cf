//! Unique username (see README.md next to this file).

use annals::decide::{DecideError, Decided, Projection, Retry};
use annals::{NewEvent, Options, Query, QueryItem, Store};

fn username(name: &str) -> String {
    format!("username:{name}")
}

/// Whether `name` is held right now.
fn taken(name: &str) -> impl annals::decide::Project<State = bool> {
    Projection::new(
        Query::item(QueryItem::tags([username(name)])),
        false,
        |taken: &mut bool, event| match event.event_type() {
            "UsernameClaimed" => *taken = true,
            "UsernameReleased" => *taken = false,
            _ => {}
        },
    )
}

/// The names an account holds now.
fn names_of(account: &str) -> impl annals::decide::Project<State = Vec<String>> {
    Projection::new(
        Query::item(QueryItem::tags([format!("account:{account}")])),
        Vec::new(),
        |names: &mut Vec<String>, event| {
            let name = String::from_utf8_lossy(event.data()).into_owned();
            match event.event_type() {
                "UsernameClaimed" => names.push(name),
                "UsernameReleased" => names.retain(|n| *n != name),
                _ => {}
            }
        },
    )
}

/// Registers `account` under `name`, unless the name is taken.
pub fn register(store: &Store, account: &str, name: &str) -> Result<Decided, DecideError<String>> {
    store.decide_and_append(&taken(name), Retry::default(), |taken| {
        if *taken {
            return Err(format!("the username {name:?} is taken"));
        }
        Ok(vec![NewEvent::new("UsernameClaimed", name.to_string())
            .tag(username(name))
            .tag(format!("account:{account}"))])
    })
}

/// Deletes `account`, releasing every name it holds.
pub fn delete_account(store: &Store, account: &str) -> Result<Decided, DecideError<String>> {
    store.decide_and_append(&names_of(account), Retry::default(), |names| {
        let mut events =
            vec![NewEvent::new("AccountDeleted", "").tag(format!("account:{account}"))];
        for name in names {
            events.push(
                NewEvent::new("UsernameReleased", name.clone())
                    .tag(username(name))
                    .tag(format!("account:{account}")),
            );
        }
        Ok(events)
    })
}

#[allow(dead_code)]
fn main() {
    let store = Store::open_in_memory(Options::default()).expect("a memory store");
    println!(
        "ada registers as 'ada': {:?}",
        register(&store, "a1", "ada").map(|d| d.position)
    );
    println!(
        "bob registers as 'ada': {}",
        register(&store, "b2", "ada").unwrap_err()
    );
    println!(
        "ada deletes her account: {:?}",
        delete_account(&store, "a1").map(|d| d.position)
    );
    println!(
        "bob registers as 'ada': {:?}",
        register(&store, "b2", "ada").map(|d| d.position)
    );
}
