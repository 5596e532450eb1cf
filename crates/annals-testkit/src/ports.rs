//! Loopback ports for the programs tests start (servers, Jaeger, object storage, PostgreSQL,
//! containers). A port found free with `bind(0)` and let go is only free until something else
//! on the machine takes it: another test process's `bind(0)`, or any outgoing connection,
//! since both draw from the kernel's ephemeral range. The program a test starts binds its
//! port seconds later (PostgreSQL after `initdb`), and binds it again after a restart, so on
//! a busy machine running several test binaries at once that window is real.
//!
//! So ports are taken below the ephemeral range, where the kernel never assigns one by
//! itself, and each is claimed for this process's life by an abstract Unix socket of its
//! own name, which no other test process can bind while it is held and which goes away with
//! the process however it ends. Where the ephemeral range leaves no room below it, a port
//! is found with `bind(0)` as before.

use std::hash::{BuildHasher, Hasher};
use std::net::TcpListener;
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr, UnixListener};
use std::sync::Mutex;

/// The lowest port handed out below the ephemeral range.
const FIRST: u16 = 10_000;

/// The claims held: one per port handed out, for the process's life.
static CLAIMED: Mutex<Vec<UnixListener>> = Mutex::new(Vec::new());

/// The first port of the kernel's ephemeral range (`ip_local_port_range`; 32768 when it
/// cannot be read).
fn ephemeral_start() -> u16 {
    std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|text| text.split_whitespace().next()?.parse().ok())
        .unwrap_or(32_768)
}

/// A loopback port nothing listens on, that no other test process is handed while this one
/// lives and that the kernel hands to nobody.
pub fn free_port() -> u16 {
    let end = ephemeral_start();
    if end < FIRST + 1_000 {
        return any_free_port();
    }
    let span = u32::from(end - FIRST);
    let start = (std::hash::RandomState::new().build_hasher().finish() % u64::from(span)) as u32;
    let mut claimed = CLAIMED.lock().unwrap_or_else(|e| e.into_inner());
    for i in 0..span {
        let port = FIRST + ((start + i) % span) as u16;
        let name = format!("annals-test-port-{port}");
        let Ok(address) = SocketAddr::from_abstract_name(name.as_bytes()) else {
            continue;
        };
        // Held by another test process, or already by this one.
        let Ok(claim) = UnixListener::bind_addr(&address) else {
            continue;
        };
        // Something outside the tests listens there, on loopback or on any address of
        // either family (some programs check their ports on every address before they bind).
        if ["127.0.0.1", "0.0.0.0", "::"]
            .iter()
            .any(|ip| in_use(ip, port))
        {
            continue;
        }
        claimed.push(claim);
        return port;
    }
    panic!("no free port between {FIRST} and {end}");
}

/// Whether `port` on `ip` is taken (an address this machine does not have is not).
fn in_use(ip: &str, port: u16) -> bool {
    matches!(
        TcpListener::bind((ip, port)),
        Err(e) if e.kind() == std::io::ErrorKind::AddrInUse
    )
}

/// A port the kernel finds free now (`bind(0)`).
fn any_free_port() -> u16 {
    TcpListener::bind(("127.0.0.1", 0))
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Goal: ports handed out are below the ephemeral range, free to bind, and never the same
    /// twice in one process; a port claimed here cannot be claimed by another process (the
    /// abstract name is taken). Where the range leaves no room below it, the ports are only
    /// free to bind.
    #[test]
    fn ports_are_below_the_ephemeral_range_and_claimed_once() {
        let ports: Vec<u16> = (0..50).map(|_| free_port()).collect();
        let end = ephemeral_start();
        let claimed = end >= FIRST + 1_000;
        if claimed {
            let mut distinct = ports.clone();
            distinct.sort();
            distinct.dedup();
            assert_eq!(distinct.len(), ports.len(), "{ports:?}");
        }
        for &port in &ports {
            if claimed {
                assert!(
                    (FIRST..end).contains(&port),
                    "{port} outside {FIRST}..{end}"
                );
                let name = format!("annals-test-port-{port}");
                let address = SocketAddr::from_abstract_name(name.as_bytes()).unwrap();
                assert!(
                    UnixListener::bind_addr(&address).is_err(),
                    "{port} unclaimed"
                );
            }
            TcpListener::bind(("127.0.0.1", port)).expect("a port handed out binds");
        }
    }
}
