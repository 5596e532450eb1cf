//! API keys as bearer tokens, each with scopes, and optionally bound to exchange accounts.
//! With no keys configured the server is open (and then it listens on loopback only unless
//! asked otherwise).

use std::collections::HashMap;
use std::path::Path;

/// What a key may do. `admin` implies the others; `metrics` reads `/metrics` and the store's
/// statistics and nothing else (a scraper's key, which can neither read events nor erase).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Scopes(u8);

impl Scopes {
    pub const READ: Scopes = Scopes(1);
    pub const APPEND: Scopes = Scopes(2);
    pub const ADMIN: Scopes = Scopes(4);
    pub const METRICS: Scopes = Scopes(8);

    pub fn contains(self, needed: Scopes) -> bool {
        self.0 & Scopes::ADMIN.0 != 0 || self.0 & needed.0 == needed.0
    }

    pub fn union(self, other: Scopes) -> Scopes {
        Scopes(self.0 | other.0)
    }

    pub fn name(self) -> &'static str {
        match self {
            Scopes::READ => "read",
            Scopes::APPEND => "append",
            Scopes::ADMIN => "admin",
            Scopes::METRICS => "metrics",
            _ => "several",
        }
    }

    pub fn parse_list<'a>(names: impl IntoIterator<Item = &'a str>) -> Result<Scopes, String> {
        let mut scopes = Scopes::default();
        for name in names {
            let scope = match name.trim() {
                "read" => Scopes::READ,
                "append" => Scopes::APPEND,
                "admin" => Scopes::ADMIN,
                "metrics" => Scopes::METRICS,
                other => {
                    return Err(format!(
                        "unknown scope {other:?}: expected read, append, admin or metrics"
                    ))
                }
            };
            scopes = scopes.union(scope);
        }
        if scopes == Scopes::default() {
            return Err("a key needs at least one scope (read, append, admin, metrics)".into());
        }
        Ok(scopes)
    }
}

/// The configured keys.
#[derive(Clone, Default)]
pub struct ApiKeys {
    keys: HashMap<String, Grant>,
}

/// What a presented key may do: its scopes, and the exchange accounts it may act for and
/// watch (None: any account).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Grant {
    scopes: Scopes,
    accounts: Option<Vec<u64>>,
}

impl Grant {
    /// What a request gets when no keys are configured: everything.
    fn open() -> Grant {
        Grant {
            scopes: Scopes::ADMIN,
            accounts: None,
        }
    }

    /// Whether the key may act for (and watch) `account` on the exchange.
    pub fn allows(&self, account: u64) -> bool {
        self.accounts
            .as_ref()
            .is_none_or(|accounts| accounts.contains(&account))
    }
}

impl std::fmt::Debug for ApiKeys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never print the keys themselves.
        write!(f, "ApiKeys({} keys)", self.keys.len())
    }
}

/// Why a request was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Denied {
    /// No key, a malformed header, or a key that is not configured: 401.
    Unauthenticated,
    /// A valid key without the scope the endpoint needs: 403.
    Forbidden(Scopes),
}

impl Denied {
    pub fn message(self) -> String {
        match self {
            Denied::Unauthenticated => {
                "missing or invalid API key: send `Authorization: Bearer <key>`".into()
            }
            Denied::Forbidden(needed) => {
                format!("this API key lacks the `{}` scope", needed.name())
            }
        }
    }
}

impl ApiKeys {
    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }

    pub fn len(&self) -> usize {
        self.keys.len()
    }

    pub fn insert(&mut self, key: String, scopes: Scopes) -> Result<(), String> {
        self.insert_bound(key, scopes, None)
    }

    /// Adds a key bound to exchange `accounts` (None: any account). A key given twice gets
    /// the union of its scopes; its account bindings must agree on being bound or not.
    pub fn insert_bound(
        &mut self,
        key: String,
        scopes: Scopes,
        accounts: Option<Vec<u64>>,
    ) -> Result<(), String> {
        if key.len() < 16 || key.chars().any(|c| c.is_whitespace() || c.is_control()) {
            return Err(
                "an API key must be at least 16 characters, without spaces or control characters"
                    .into(),
            );
        }
        if accounts.as_ref().is_some_and(Vec::is_empty) {
            return Err("a key bound to accounts needs at least one account".into());
        }
        match self.keys.get_mut(&key) {
            None => {
                self.keys.insert(key, Grant { scopes, accounts });
            }
            Some(grant) => {
                grant.scopes = grant.scopes.union(scopes);
                match (&mut grant.accounts, accounts) {
                    (None, None) => {}
                    (Some(known), Some(more)) => {
                        known.extend(more);
                        known.sort_unstable();
                        known.dedup();
                    }
                    _ => {
                        return Err(
                            "a key is given twice, once bound to accounts and once not".into()
                        )
                    }
                }
            }
        }
        Ok(())
    }

    /// `key=scope,scope;key2=scope`, the form of `ANNALS_API_KEYS`.
    pub fn parse_inline(&mut self, text: &str) -> Result<(), String> {
        for part in text.split(';').map(str::trim).filter(|p| !p.is_empty()) {
            let (key, scopes) = part
                .split_once('=')
                .ok_or("API keys are written key=scope,scope;key2=scope")?;
            self.insert(
                key.trim().to_string(),
                Scopes::parse_list(scopes.split(','))?,
            )?;
        }
        Ok(())
    }

    /// A file with one `key scope,scope [accounts=1,2]` per line; `#` starts a comment.
    pub fn load_file(&mut self, path: &Path) -> Result<(), String> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| format!("cannot read API key file {}: {e}", path.display()))?;
        for (n, line) in text.lines().enumerate() {
            let line = line.split('#').next().unwrap_or("").trim();
            if line.is_empty() {
                continue;
            }
            let mut words = line.split_whitespace();
            let (Some(key), Some(scopes), accounts, None) =
                (words.next(), words.next(), words.next(), words.next())
            else {
                return Err(format!(
                    "{}:{}: expected `key scope,scope [accounts=1,2]`",
                    path.display(),
                    n + 1
                ));
            };
            let accounts = accounts.map(parse_accounts).transpose();
            Scopes::parse_list(scopes.split(','))
                .and_then(|scopes| self.insert_bound(key.to_string(), scopes, accounts?))
                .map_err(|e| format!("{}:{}: {e}", path.display(), n + 1))?;
        }
        Ok(())
    }

    /// Checks an `Authorization` header value against the keys for `needed`.
    pub fn check(&self, authorization: Option<&[u8]>, needed: Scopes) -> Result<(), Denied> {
        self.grant(authorization, needed).map(|_| ())
    }

    /// Like [`ApiKeys::check`], answering what the key may do.
    pub fn grant(&self, authorization: Option<&[u8]>, needed: Scopes) -> Result<Grant, Denied> {
        if self.keys.is_empty() {
            return Ok(Grant::open());
        }
        let presented = authorization
            .and_then(|v| std::str::from_utf8(v).ok())
            .and_then(|v| {
                v.strip_prefix("Bearer ")
                    .or_else(|| v.strip_prefix("bearer "))
            })
            .map(str::trim)
            .ok_or(Denied::Unauthenticated)?;
        // Compare against every key in full so the time taken does not reveal a prefix.
        let mut found = None;
        for (key, grant) in &self.keys {
            if constant_time_eq(key.as_bytes(), presented.as_bytes()) {
                found = Some(grant);
            }
        }
        let grant = found.ok_or(Denied::Unauthenticated)?;
        if grant.scopes.contains(needed) {
            Ok(grant.clone())
        } else {
            Err(Denied::Forbidden(needed))
        }
    }
}

/// `accounts=1,2,3` (the key file's third word).
fn parse_accounts(word: &str) -> Result<Vec<u64>, String> {
    let list = word
        .strip_prefix("accounts=")
        .ok_or_else(|| format!("expected accounts=1,2 after the scopes, not {word:?}"))?;
    list.split(',')
        .map(|a| {
            a.trim()
                .parse::<u64>()
                .map_err(|_| format!("account {a:?} is not an unsigned integer"))
        })
        .collect()
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Goal: with no API keys every request is let in; with keys, a request without one, with
    /// another scheme or an unknown key is unauthenticated, and a known key may do only what its
    /// scopes allow.
    #[test]
    fn scopes_and_keys() {
        let mut keys = ApiKeys::default();
        assert_eq!(keys.check(None, Scopes::ADMIN), Ok(()), "no keys: open");
        keys.parse_inline("reader-key-0123456789=read; writer-key-0123456789=read,append")
            .unwrap();
        keys.insert("admin-key-0123456789".into(), Scopes::ADMIN)
            .unwrap();
        let bearer = |k: &str| format!("Bearer {k}");
        assert_eq!(keys.check(None, Scopes::READ), Err(Denied::Unauthenticated));
        assert_eq!(
            keys.check(Some(b"Basic abc"), Scopes::READ),
            Err(Denied::Unauthenticated)
        );
        assert_eq!(
            keys.check(
                Some(bearer("wrong-key-0123456789").as_bytes()),
                Scopes::READ
            ),
            Err(Denied::Unauthenticated)
        );
        let reader = bearer("reader-key-0123456789");
        assert_eq!(keys.check(Some(reader.as_bytes()), Scopes::READ), Ok(()));
        assert_eq!(
            keys.check(Some(reader.as_bytes()), Scopes::APPEND),
            Err(Denied::Forbidden(Scopes::APPEND))
        );
        let writer = bearer("writer-key-0123456789");
        assert_eq!(keys.check(Some(writer.as_bytes()), Scopes::APPEND), Ok(()));
        assert_eq!(
            keys.check(Some(writer.as_bytes()), Scopes::ADMIN),
            Err(Denied::Forbidden(Scopes::ADMIN))
        );
        let admin = bearer("admin-key-0123456789");
        for scope in [Scopes::READ, Scopes::APPEND, Scopes::ADMIN] {
            assert_eq!(keys.check(Some(admin.as_bytes()), scope), Ok(()));
        }
    }

    /// Goal: a key bound to accounts acts only for those accounts, a key without a binding for any;
    /// a second binding of one key adds accounts, a key both bound and unbound is refused, and a
    /// bad accounts list in a key file is refused naming its line.
    #[test]
    fn keys_bound_to_accounts() {
        let mut keys = ApiKeys::default();
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("keys");
        std::fs::write(
            &path,
            "trader-key-0123456789 read,append accounts=7,8\nadmin-key-0123456789 admin\n",
        )
        .unwrap();
        keys.load_file(&path).unwrap();
        let trader = keys
            .grant(Some(b"Bearer trader-key-0123456789"), Scopes::APPEND)
            .unwrap();
        assert!(trader.allows(7) && trader.allows(8) && !trader.allows(9));
        let admin = keys
            .grant(Some(b"Bearer admin-key-0123456789"), Scopes::APPEND)
            .unwrap();
        assert!(admin.allows(9));
        assert!(ApiKeys::default()
            .grant(None, Scopes::ADMIN)
            .unwrap()
            .allows(1));
        // A second binding adds accounts; bound and unbound definitions of one key clash.
        keys.insert_bound("trader-key-0123456789".into(), Scopes::READ, Some(vec![9]))
            .unwrap();
        let trader = keys
            .grant(Some(b"Bearer trader-key-0123456789"), Scopes::READ)
            .unwrap();
        assert!(trader.allows(9));
        assert!(keys
            .insert("trader-key-0123456789".into(), Scopes::READ)
            .is_err());
        std::fs::write(&path, "other-key-0123456789 read accounts=x\n").unwrap();
        assert!(keys.load_file(&path).unwrap_err().contains(":1:"));
        std::fs::write(&path, "other-key-0123456789 read accounts=\n").unwrap();
        assert!(keys.load_file(&path).is_err());
    }

    /// Goal: a key too short, an unknown scope or a key without scopes is refused, and a bad line
    /// in a key file is refused naming its line, the lines before it kept.
    #[test]
    fn bad_key_definitions_are_rejected() {
        let mut keys = ApiKeys::default();
        assert!(keys.parse_inline("short=read").is_err());
        assert!(keys.parse_inline("long-enough-key-0123=write").is_err());
        assert!(keys.parse_inline("long-enough-key-0123").is_err());
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("keys");
        std::fs::write(
            &path,
            "# comment\nfile-key-0123456789 read,append\n\nbad line here\n",
        )
        .unwrap();
        let err = keys.load_file(&path).unwrap_err();
        assert!(err.contains(":4:"), "{err}");
        assert_eq!(keys.len(), 1, "lines before the bad one were read");
    }
}
