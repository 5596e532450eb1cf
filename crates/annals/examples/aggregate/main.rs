//! An event-sourced aggregate (a bank account) on top of DCB (see README.md next to this file).

use annals::decide::{DecideError, Decided, Projection, Retry};
use annals::snapshot::{SnapshotPolicy, Snapshotted};
use annals::{NewEvent, Options, Query, QueryItem, Store};

/// The aggregate's state: whether the account is open, and its balance.
#[derive(Clone, Default, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Account {
    pub opened: bool,
    pub balance: i64,
}

fn account(id: &str) -> impl annals::decide::Project<State = Account> {
    Projection::new(
        Query::item(QueryItem::tags([format!("account:{id}")])),
        Account::default(),
        |a: &mut Account, event| {
            let amount: i64 = std::str::from_utf8(event.data())
                .ok()
                .and_then(|d| d.parse().ok())
                .unwrap_or(0);
            match event.event_type() {
                "AccountOpened" => a.opened = true,
                "MoneyDeposited" => a.balance += amount,
                "MoneyWithdrawn" => a.balance -= amount,
                _ => {}
            }
        },
    )
}

/// The account as the store snapshots it: an account with years of movements is decided on by
/// reading its movements since the last snapshot (saved after every 100), in any process.
fn snapshotted_account(id: &str) -> Snapshotted<impl annals::decide::Project<State = Account>> {
    let policy = SnapshotPolicy {
        every: 100,
        slower_than: None,
    };
    Snapshotted::new("account", 1, account(id)).policy(policy)
}

/// Runs one command on the account: `decide` turns the current state into new events.
fn handle(
    store: &Store,
    id: &str,
    decide: impl Fn(&Account) -> Result<Vec<(&'static str, i64)>, String>,
) -> Result<Decided, DecideError<String>> {
    store.decide_and_append(
        &snapshotted_account(id),
        Retry {
            attempts: 100,
            ..Retry::default()
        },
        |state| {
            Ok(decide(state)?
                .into_iter()
                .map(|(kind, amount)| {
                    NewEvent::new(kind, amount.to_string()).tag(format!("account:{id}"))
                })
                .collect())
        },
    )
}

pub fn open(store: &Store, id: &str) -> Result<Decided, DecideError<String>> {
    handle(store, id, |a| {
        if a.opened {
            Err("already open".into())
        } else {
            Ok(vec![("AccountOpened", 0)])
        }
    })
}

pub fn deposit(store: &Store, id: &str, amount: i64) -> Result<Decided, DecideError<String>> {
    handle(store, id, |a| {
        if !a.opened {
            return Err("no such account".into());
        }
        Ok(vec![("MoneyDeposited", amount)])
    })
}

pub fn withdraw(store: &Store, id: &str, amount: i64) -> Result<Decided, DecideError<String>> {
    handle(store, id, |a| {
        if !a.opened {
            return Err("no such account".into());
        }
        if a.balance < amount {
            return Err(format!(
                "insufficient funds: balance {}, asked {amount}",
                a.balance
            ));
        }
        Ok(vec![("MoneyWithdrawn", amount)])
    })
}

pub fn balance(store: &Store, id: &str) -> Account {
    store.decide(&account(id)).expect("a read").state
}

#[allow(dead_code)]
fn main() {
    let store = Store::open_in_memory(Options::default()).expect("a memory store");
    open(&store, "acc-1").expect("opened");
    deposit(&store, "acc-1", 100).expect("deposited");
    println!(
        "withdraw 70: {:?}",
        withdraw(&store, "acc-1", 70).map(|d| d.position)
    );
    println!(
        "withdraw 70: {}",
        withdraw(&store, "acc-1", 70).unwrap_err()
    );
    println!("state: {:?}", balance(&store, "acc-1"));
}
