//! Opt-in token (see README.md next to this file).

use annals::decide::{DecideError, Decided, Projection, Retry};
use annals::{NewEvent, Options, Query, QueryItem, Store};

#[derive(Clone, Default)]
pub struct TokenState {
    pub issued_to: Option<String>,
    pub used: bool,
}

fn token_state(token: &str) -> impl annals::decide::Project<State = TokenState> {
    Projection::new(
        Query::item(QueryItem::tags([format!("token:{token}")])),
        TokenState::default(),
        |s: &mut TokenState, event| match event.event_type() {
            "OptInTokenIssued" => s.issued_to = Some(String::from_utf8_lossy(event.data()).into()),
            "SignUpConfirmed" => s.used = true,
            _ => {}
        },
    )
}

pub fn issue(store: &Store, email: &str, token: &str) -> Result<u64, annals::AppendError> {
    store.append(
        &[NewEvent::new("OptInTokenIssued", email.to_string())
            .tag(format!("token:{token}"))
            .tag(format!("email:{email}"))],
        None,
    )
}

pub fn confirm(store: &Store, token: &str) -> Result<Decided, DecideError<&'static str>> {
    store.decide_and_append(&token_state(token), Retry::default(), |state| {
        let email = state.issued_to.as_ref().ok_or("unknown token")?;
        if state.used {
            return Err("token already used");
        }
        Ok(vec![NewEvent::new("SignUpConfirmed", email.clone())
            .tag(format!("token:{token}"))
            .tag(format!("email:{email}"))])
    })
}

#[allow(dead_code)]
fn main() {
    let store = Store::open_in_memory(Options::default()).expect("a memory store");
    issue(&store, "ada@example.com", "tok-1").expect("issued");
    println!(
        "first click:  {:?}",
        confirm(&store, "tok-1").map(|d| d.position)
    );
    println!(
        "second click: {:?}",
        confirm(&store, "tok-1").map(|d| d.position)
    );
    println!(
        "forged token: {:?}",
        confirm(&store, "tok-x").map(|d| d.position)
    );
}
