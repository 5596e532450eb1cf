//! `annals-bench subjects`: data subjects (crypto-shredding). In one run:
//! - 64 writers and 1 writer, D3, conditional appends of one event tagged with its writer's
//!   stream and one of 100,000 entities, with `entity:` configured as the subject prefix
//!   (every event sealed, keys made on first use) and without subjects, alternated, beside the
//!   fdatasync floor;
//! - a full scan and selective reads (one entity among 100,000, ten events each) of a store
//!   whose events are sealed, beside the same store unsealed, each counting the events and
//!   again reading their data, with the cipher's floors (a key set up once, and per event);
//! - erasing a subject with `--erase-events` events, beside erasing one with a single event.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use annals::{
    Durability, MasterKey, NewEvent, Options, Query, QueryItem, ReadOptions, Store, SubjectOptions,
};
use bytes::Bytes;
use hdrhistogram::Histogram;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::{json, Value};

use crate::bench::{
    append_run, bench_options, conditional_writers, fsync_floor, full_scans, latency_json, median,
    AppendArgs,
};

#[derive(clap::Args)]
pub struct SubjectsArgs {
    /// Directory for the stores (emptied first) and the fsync floor file.
    #[arg(long, default_value = "/tmp/annals-bench-subjects")]
    dir: PathBuf,
    /// Alternated runs of each writer count, without and with subjects.
    #[arg(long, default_value_t = 3)]
    runs: usize,
    /// Events of each 64-writer run (1-writer runs take a tenth).
    #[arg(long, default_value_t = 200_000)]
    events: u64,
    /// Events of the stores read (each tagged with one of 100,000 entities).
    #[arg(long, default_value_t = 1_000_000)]
    read_events: u64,
    /// Selective reads timed on each store.
    #[arg(long, default_value_t = 20_000)]
    reads: u64,
    /// Events of the large subject erased.
    #[arg(long, default_value_t = 100_000)]
    erase_events: u64,
    /// The parts to run: writes, reads, erase (comma-separated; all by default).
    #[arg(long, value_delimiter = ',', default_value = "writes,reads,erase")]
    parts: Vec<String>,
}

const ENTITIES: u64 = 100_000;

fn subjects() -> SubjectOptions {
    SubjectOptions::new(
        ["entity:"],
        MasterKey::generate().expect("a random master key"),
    )
}

fn writers_args(dir: &Path, writers: usize, events: u64, sealed: bool) -> AppendArgs {
    AppendArgs {
        subjects: sealed.then(subjects),
        ..conditional_writers(dir, writers, events)
    }
}

/// Alternated runs of `writers` without and with subjects: (without, with) appends/s.
fn alternate(
    args: &SubjectsArgs,
    writers: usize,
    events: u64,
) -> Result<(Vec<f64>, Vec<f64>), String> {
    let store_dir = args.dir.join("writers");
    let (mut plain, mut sealed) = (Vec::new(), Vec::new());
    for run in 0..args.runs {
        let p = append_run(
            &writers_args(&args.dir, writers, events, false),
            Durability::Synced,
            &store_dir,
        )?;
        let s = append_run(
            &writers_args(&args.dir, writers, events, true),
            Durability::Synced,
            &store_dir,
        )?;
        eprintln!(
            "{writers} writer(s), run {}: {:.0} appends/s plain, {:.0} sealed",
            run + 1,
            p.appends_per_sec,
            s.appends_per_sec
        );
        plain.push(p.appends_per_sec);
        sealed.push(s.appends_per_sec);
    }
    let _ = std::fs::remove_dir_all(&store_dir);
    Ok((plain, sealed))
}

/// A fresh store in `dir`, sealing for `subjects` when given, with `events` events appended
/// 4,096 to an append, the event at each position (from 0) made by `event`.
fn build(
    dir: &Path,
    events: u64,
    subjects: Option<SubjectOptions>,
    event: impl Fn(u64) -> NewEvent,
) -> Result<Store, String> {
    let _ = std::fs::remove_dir_all(dir);
    let options = Options {
        subjects,
        ..bench_options(Durability::Synced)
    };
    let store = Store::open(dir, options).map_err(|e| e.to_string())?;
    let mut written = 0;
    while written < events {
        let batch: Vec<NewEvent> = (written..events.min(written + 4096)).map(&event).collect();
        written += batch.len() as u64;
        store.append(&batch, None).map_err(|e| e.to_string())?;
    }
    Ok(store)
}

/// A store of `events` events, 256-byte data, each tagged with one of 100,000 entities, sealed
/// when `subjects` is given.
fn entities(dir: &Path, events: u64, subjects: Option<SubjectOptions>) -> Result<Store, String> {
    let payload = Bytes::from(vec![b'y'; 256]);
    build(dir, events, subjects, |p| {
        NewEvent::new("Deposited", payload.clone())
            .tag(format!("entity:{}", p % ENTITIES))
            .tag(format!("region:{}", p % 16))
    })
}

/// What `reads` measured of one store.
struct Reads {
    /// Full scans, events/s (median of three).
    scan: f64,
    /// The same, the data of every event summed by the reader.
    scan_consuming: f64,
    /// Selective reads of one entity's events, nanoseconds each.
    selective: Histogram<u64>,
    /// The same, the data of every event summed by the reader (other entities: seed 8).
    selective_consuming: Histogram<u64>,
}

/// What a reader that uses an event's data does at the least: reads every byte of it once.
fn consume(data: &[u8]) -> u64 {
    std::hint::black_box(data.iter().fold(0u64, |a, &b| a.wrapping_add(u64::from(b))))
}

/// Full scans and selective reads of `store`, each twice: counting the events only, and
/// reading every byte of their data as a consumer would (a plain store's reader otherwise
/// never touches the data, while a sealed one's decryption must).
fn reads(store: &Store, reads: u64) -> Result<Reads, String> {
    let head = store.head();
    let scan = |consuming: bool| -> Result<f64, String> {
        let mut bytes = 0usize;
        let (rate, events) = full_scans(store, |event| {
            if consuming {
                consume(event.data());
            }
            bytes += event.data().len();
        })?;
        if events != head || bytes != 3 * head as usize * 256 {
            return Err(format!(
                "full scans read {events} events, {bytes} bytes of data"
            ));
        }
        Ok(rate)
    };
    let selective = |seed: u64, consuming: bool| -> Result<Histogram<u64>, String> {
        let mut rng = StdRng::seed_from_u64(seed);
        let mut latency = Histogram::<u64>::new(3).map_err(|e| e.to_string())?;
        let per_entity = head / ENTITIES;
        for _ in 0..reads {
            let query = Query::item(QueryItem::tags([format!(
                "entity:{}",
                rng.gen_range(0..ENTITIES)
            )]));
            let t = Instant::now();
            let mut n = 0;
            for event in store
                .read(&query, ReadOptions::forwards())
                .map_err(|e| e.to_string())?
            {
                let event = event.map_err(|e| e.to_string())?;
                if consuming {
                    consume(event.data());
                }
                n += event.data().len().min(1) as u64;
            }
            latency.record(t.elapsed().as_nanos() as u64).ok();
            if n != per_entity {
                return Err(format!(
                    "a selective read found {n} events, expected {per_entity}"
                ));
            }
        }
        Ok(latency)
    };
    Ok(Reads {
        scan: scan(false)?,
        scan_consuming: scan(true)?,
        selective: selective(7, false)?,
        selective_consuming: selective(8, true)?,
    })
}

/// Erases a subject with `events` events and one with a single event, in one store (with a
/// thousand other subjects): the seconds each erasure took (key file rewritten and synced, receipt synced).
fn erasures(dir: &Path, events: u64) -> Result<(f64, f64, u64), String> {
    let payload = Bytes::from(vec![b'z'; 256]);
    let store = build(dir, events, Some(subjects()), |p| {
        NewEvent::new("Moved", payload.clone())
            .tag("entity:big")
            .tag(format!("region:{}", p % 16))
    })?;
    // A thousand other subjects, so that the key file is not trivially small.
    for i in 0..1000 {
        let e = NewEvent::new("Moved", payload.clone()).tag(format!("entity:{i}"));
        store.append(&[e], None).map_err(|e| e.to_string())?;
    }
    let t = Instant::now();
    let big = store
        .erase_subject("entity:big")
        .map_err(|e| e.to_string())?;
    let big_s = t.elapsed().as_secs_f64();
    let t = Instant::now();
    let small = store.erase_subject("entity:7").map_err(|e| e.to_string())?;
    let small_s = t.elapsed().as_secs_f64();
    if big.events != events || small.events != 1 {
        return Err(format!("erased {} and {} events", big.events, small.events));
    }
    store.close().map_err(|e| e.to_string())?;
    let _ = std::fs::remove_dir_all(dir);
    Ok((big_s, small_s, big.events))
}

/// The cipher's own floor, nanoseconds per 256-byte event on one core (median of three
/// rounds), from RustCrypto and from aws-lc (the store uses the one `annals::SUBJECT_CIPHER`
/// names): opening under one key set up once (a run of one subject's events), and opening
/// under a key set up for the event (round keys and GHASH's tables), as a reader pays when
/// the subject changes, which a full scan of interleaved subjects does at nearly every event.
struct CipherFloors {
    rustcrypto: f64,
    aws_lc: f64,
    rustcrypto_new_key: f64,
    aws_lc_new_key: f64,
}

/// Keys the new-key floors cycle through, each event sealed under its own.
const FLOOR_KEYS: usize = 1000;

fn floor_key(i: usize) -> [u8; 32] {
    let mut key = [7u8; 32];
    key[..8].copy_from_slice(&(i as u64).to_le_bytes());
    key
}

/// One implementation's two floors (see [`CipherFloors`]): `key` sets up the cipher of key
/// `i`, `seal` seals a buffer in place and answers its tag, `open` opens sealed bytes with
/// their tag into the buffer.
fn floors_of<C, T>(
    key: impl Fn(usize) -> C,
    seal: impl Fn(&C, &mut [u8]) -> T,
    open: impl Fn(&C, &[u8], &T, &mut [u8]),
) -> (f64, f64) {
    let plain = vec![5u8; 4 + 256];
    let sealed: Vec<(Vec<u8>, T)> = (0..FLOOR_KEYS)
        .map(|i| {
            let mut bytes = plain.clone();
            let tag = seal(&key(i), &mut bytes);
            (bytes, tag)
        })
        .collect();
    let mut buf = plain;
    let one = key(0);
    let same = rounds(|_| open(&one, &sealed[0].0, &sealed[0].1, &mut buf));
    let new_key = rounds(|n| {
        let (bytes, tag) = &sealed[n % FLOOR_KEYS];
        open(&key(n % FLOOR_KEYS), bytes, tag, &mut buf)
    });
    (same, new_key)
}

fn cipher_floors() -> CipherFloors {
    let aad = [1u8; 40];
    let (rustcrypto, rustcrypto_new_key) = {
        use aes_gcm::aead::{AeadInOut, KeyInit};
        let nonce = [3u8; 12].into();
        floors_of(
            |i| aes_gcm::Aes256Gcm::new(&floor_key(i).into()),
            |cipher, buf| {
                cipher
                    .encrypt_inout_detached(&nonce, &aad, buf.into())
                    .expect("encryption of a small buffer")
            },
            |cipher, bytes, tag, buf| {
                buf.copy_from_slice(bytes);
                cipher
                    .decrypt_inout_detached(&nonce, &aad, buf.into(), tag)
                    .expect("the buffer just sealed opens");
            },
        )
    };
    let (aws_lc, aws_lc_new_key) = {
        use aws_lc_rs::aead::{Aad, LessSafeKey, Nonce, UnboundKey, AES_256_GCM};
        let nonce = || Nonce::assume_unique_for_key([3u8; 12]);
        floors_of(
            |i| LessSafeKey::new(UnboundKey::new(&AES_256_GCM, &floor_key(i)).expect("a key")),
            |key, buf| {
                key.seal_in_place_separate_tag(nonce(), Aad::from(&aad), buf)
                    .expect("encryption of a small buffer")
            },
            |key, bytes, tag, buf| {
                key.open_separate_gather(nonce(), Aad::from(&aad), bytes, tag.as_ref(), buf)
                    .expect("the buffer just sealed opens");
            },
        )
    };
    CipherFloors {
        rustcrypto,
        aws_lc,
        rustcrypto_new_key,
        aws_lc_new_key,
    }
}

/// Nanoseconds per call of `f`: the median of three rounds of 200,000 calls.
fn rounds(mut f: impl FnMut(usize)) -> f64 {
    let calls = 200_000;
    let mut times = Vec::new();
    for _ in 0..3 {
        let started = Instant::now();
        for n in 0..calls {
            f(n);
        }
        times.push(started.elapsed().as_nanos() as f64 / calls as f64);
    }
    median(times)
}

pub fn run(args: SubjectsArgs) -> Result<Value, String> {
    let part = |name: &str| args.parts.iter().any(|p| p == name);
    let _ = std::fs::remove_dir_all(&args.dir);
    std::fs::create_dir_all(&args.dir).map_err(|e| e.to_string())?;
    let ratio = |a: f64, b: f64| (a / b * 100.0).round() / 100.0;
    let p99 = |h: &Histogram<u64>| h.value_at_quantile(0.99) as f64;
    let mut out = json!({"bench": "subjects", "parts": args.parts});

    if part("writes") {
        let floor = fsync_floor(&args.dir, true, Duration::from_secs(1))?;
        let (plain64, sealed64) = alternate(&args, 64, args.events)?;
        let (plain1, sealed1) = alternate(&args, 1, (args.events / 10).max(1000))?;
        let floor_after = fsync_floor(&args.dir, true, Duration::from_secs(1))?;
        out["fsync_floor_per_sec"] = json!(floor);
        out["fsync_floor_before_after"] = json!([floor, floor_after]);
        out["writers_64_d3"] = json!({
            "workload": "conditional_append, 1 event of 256 bytes, tags stream:<writer> and entity:<one of 100,000>, 64 async writers, embedded",
            "runs_plain": plain64, "runs_sealed": sealed64,
            "plain_appends_per_sec": median(plain64.clone()),
            "sealed_appends_per_sec": median(sealed64.clone()),
            "ratio_sealed_to_plain": ratio(median(sealed64), median(plain64)),
        });
        out["writers_1_d3"] = json!({
            "runs_plain": plain1, "runs_sealed": sealed1,
            "plain_appends_per_sec": median(plain1.clone()),
            "sealed_appends_per_sec": median(sealed1.clone()),
            "ratio_sealed_to_plain": ratio(median(sealed1), median(plain1)),
        });
    }

    if part("reads") {
        let floors = cipher_floors();
        let (floor_ns, new_key_ns) = match annals::SUBJECT_CIPHER.contains("aws-lc") {
            true => (floors.aws_lc, floors.aws_lc_new_key),
            false => (floors.rustcrypto, floors.rustcrypto_new_key),
        };
        eprintln!(
            "AES-256-GCM opens a 256-byte event in {:.0} ns (RustCrypto), {:.0} ns (aws-lc); \
             {:.0} and {:.0} ns with the key set up for it; the store uses {}",
            floors.rustcrypto,
            floors.aws_lc,
            floors.rustcrypto_new_key,
            floors.aws_lc_new_key,
            annals::SUBJECT_CIPHER
        );
        let plain_store = entities(&args.dir.join("read-plain"), args.read_events, None)?;
        let sealed_store = entities(
            &args.dir.join("read-sealed"),
            args.read_events,
            Some(subjects()),
        )?;
        let plain = reads(&plain_store, args.reads)?;
        let sealed = reads(&sealed_store, args.reads)?;
        let (plain_scan, sealed_scan) = (plain.scan, sealed.scan);
        let (plain_lat, sealed_lat) = (&plain.selective, &sealed.selective);
        eprintln!("full scan: {plain_scan:.0} events/s plain, {sealed_scan:.0} sealed");
        plain_store.close().map_err(|e| e.to_string())?;
        sealed_store.close().map_err(|e| e.to_string())?;
        let _ = std::fs::remove_dir_all(args.dir.join("read-plain"));
        let _ = std::fs::remove_dir_all(args.dir.join("read-sealed"));
        // The best a sealed scan could do here: the plain scan's time per event plus the
        // cipher's alone.
        let bound = 1e9 / (1e9 / plain_scan + floor_ns);
        // Likewise for a selective read: the plain read's p99 plus the cipher's time for the
        // events it returns.
        let per_entity = (args.read_events / ENTITIES) as f64;
        let selective_bound = p99(plain_lat) + per_entity * floor_ns;
        // With the key set up as a reader must: for every event of a scan (its subjects
        // interleave), once for a selective read (one subject's events).
        let bound_new_key = 1e9 / (1e9 / plain_scan + new_key_ns);
        let selective_bound_new_key =
            p99(plain_lat) + new_key_ns + (per_entity - 1.0).max(0.0) * floor_ns;
        out["reads"] = json!({
            "events": args.read_events,
            "cipher": annals::SUBJECT_CIPHER,
            "cipher_floor_ns_per_event": floor_ns,
            "cipher_floor_new_key_ns_per_event": new_key_ns,
            "cipher_floor_ns_rustcrypto": floors.rustcrypto,
            "cipher_floor_ns_aws_lc": floors.aws_lc,
            "cipher_floor_new_key_ns_rustcrypto": floors.rustcrypto_new_key,
            "cipher_floor_new_key_ns_aws_lc": floors.aws_lc_new_key,
            "full_scan_events_per_sec_plain": plain_scan,
            "full_scan_events_per_sec_sealed": sealed_scan,
            "full_scan_ratio_sealed_to_plain": ratio(sealed_scan, plain_scan),
            "full_scan_bound_plain_plus_cipher": bound,
            "full_scan_bound_ratio": ratio(bound, plain_scan),
            "full_scan_bound_plain_plus_cipher_with_key_setup": bound_new_key,
            "full_scan_bound_with_key_setup_ratio": ratio(bound_new_key, plain_scan),
            "selective_latency_plain_ns": latency_json(plain_lat),
            "selective_latency_sealed_ns": latency_json(sealed_lat),
            "selective_p99_ratio_sealed_to_plain": ratio(p99(sealed_lat), p99(plain_lat)),
            "selective_p99_bound_plain_plus_cipher_ns": selective_bound,
            "selective_p99_bound_ratio": ratio(selective_bound, p99(plain_lat)),
            "selective_p99_bound_with_key_setup_ns": selective_bound_new_key,
            "selective_p99_bound_with_key_setup_ratio": ratio(selective_bound_new_key, p99(plain_lat)),
            "data_consumed": {
                "what": "the reader sums every byte of each event's data, as a consumer of the events (a server answering a read) does",
                "full_scan_events_per_sec_plain": plain.scan_consuming,
                "full_scan_events_per_sec_sealed": sealed.scan_consuming,
                "full_scan_ratio_sealed_to_plain": ratio(sealed.scan_consuming, plain.scan_consuming),
                "selective_latency_plain_ns": latency_json(&plain.selective_consuming),
                "selective_latency_sealed_ns": latency_json(&sealed.selective_consuming),
                "selective_p99_ratio_sealed_to_plain": ratio(p99(&sealed.selective_consuming), p99(&plain.selective_consuming)),
            },
        });
    }

    if part("erase") {
        let (big_s, small_s, big_events) = erasures(&args.dir.join("erase"), args.erase_events)?;
        eprintln!("erasing {big_events} events: {big_s:.4} s; 1 event: {small_s:.4} s");
        out["erase"] = json!({
            "events_of_the_large_subject": big_events,
            "seconds_large": big_s,
            "seconds_one_event": small_s,
        });
    }
    Ok(out)
}
