//! The commands for people at a terminal: `append`, `read`, `tail`, `import`, `export`. Each
//! works on a data directory (`--dir`, the store opened in this process) or against a running
//! server (`--url`, `--api-key`). Events travel as the HTTP API's JSON lines in both cases.

use std::io::{BufRead, IsTerminal, Write};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use annals::{
    AppendCondition, AppendError, NewEvent, Options, Query, QueryItem, ReadOptions, Store,
};
use annals_server::wire;
use base64::Engine;
use bytes::Bytes;
use serde::Deserialize;
use serde_json::value::RawValue;

use crate::failure::Failure;
use crate::remote::{Remote, RemoteArgs};

#[derive(clap::Args)]
pub struct Where {
    /// The store, opened by this command: a data directory (not while a server holds it) or a
    /// PostgreSQL URL, postgres://user:password@host/database.
    #[arg(long, visible_alias = "dir", value_name = "DIR|URL")]
    store: Option<String>,
    #[command(flatten)]
    server: RemoteArgs,
    #[command(flatten)]
    subjects: crate::subjects::SubjectArgs,
}

#[derive(clap::Args)]
pub struct QueryArgs {
    /// Match events of this type (repeat for several; any type when absent).
    #[arg(long = "type", value_name = "TYPE")]
    types: Vec<String>,
    /// Match events carrying this tag (repeat: all must be present).
    #[arg(long = "tag", value_name = "TAG")]
    tags: Vec<String>,
    /// A whole DCB query as JSON instead, e.g. '{"items":[{"tags":["a"]},{"types":["B"]}]}'.
    #[arg(long, value_name = "JSON", conflicts_with_all = ["types", "tags"])]
    query: Option<String>,
}

impl QueryArgs {
    fn query(&self) -> Result<Query, String> {
        if let Some(json) = &self.query {
            return serde_json::from_str(json).map_err(|e| format!("--query: {e}"));
        }
        if self.types.is_empty() && self.tags.is_empty() {
            return Ok(Query::all());
        }
        Ok(Query::item(QueryItem {
            types: self.types.clone(),
            tags: self.tags.clone(),
        }))
    }
}

#[derive(Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    /// Aligned columns: position, type, tags, data (shortened).
    Table,
    /// One JSON event per line, as the HTTP API sends them.
    Ndjson,
}

#[derive(clap::Args)]
pub struct AppendArgs {
    #[command(flatten)]
    at: Where,
    /// The event's type (one event from the arguments); without it, events are read as NDJSON
    /// from standard input.
    #[arg(long = "type", value_name = "TYPE")]
    event_type: Option<String>,
    /// A tag of the event (repeat for several).
    #[arg(long = "tag", value_name = "TAG", requires = "event_type")]
    tags: Vec<String>,
    /// The event's data.
    #[arg(long, default_value = "", requires = "event_type")]
    data: String,
    /// The event's id (a UUID). An id is not a key: an append without a failing condition is
    /// stored whatever ids it carries. Only under --condition is a retry recognised by ids:
    /// when the condition fails and the first events matching it carry exactly these ids, the
    /// append answers the position already stored instead of failing.
    #[arg(long, requires = "event_type")]
    id: Option<uuid::Uuid>,
    /// An append condition as JSON: '{"failIfEventsMatch":{"items":[...]},"after":n}'.
    #[arg(long, value_name = "JSON")]
    condition: Option<String>,
    /// Events per append when reading standard input (each append is atomic).
    #[arg(long, default_value_t = 1000)]
    batch: usize,
}

#[derive(clap::Args)]
pub struct ReadArgs {
    #[command(flatten)]
    at: Where,
    #[command(flatten)]
    query: QueryArgs,
    /// First position (inclusive; the maximum when --backwards).
    #[arg(long)]
    from: Option<u64>,
    /// Start after this position (exclusive).
    #[arg(long, conflicts_with = "from")]
    after: Option<u64>,
    /// At most this many events.
    #[arg(long)]
    limit: Option<u64>,
    /// Newest first.
    #[arg(long)]
    backwards: bool,
    #[arg(long, value_enum, default_value = "table")]
    format: Format,
}

#[derive(clap::Args)]
pub struct TailArgs {
    #[command(flatten)]
    at: Where,
    #[command(flatten)]
    query: QueryArgs,
    /// Start after this position (0: from the beginning). Default: the current head, so only
    /// new events are shown.
    #[arg(long)]
    after: Option<u64>,
    /// Stop after this many events.
    #[arg(long)]
    count: Option<u64>,
    #[arg(long, value_enum, default_value = "table")]
    format: Format,
}

#[derive(clap::Args)]
pub struct ExportArgs {
    #[command(flatten)]
    at: Where,
    #[command(flatten)]
    query: QueryArgs,
    /// Write here instead of standard output.
    #[arg(long, short, value_name = "FILE")]
    output: Option<PathBuf>,
}

#[derive(clap::Args)]
pub struct ImportArgs {
    #[command(flatten)]
    at: Where,
    /// NDJSON events (as `annals export` writes them); `-` for standard input. An event keeps
    /// the position its line gives: a line at or below the store's head must match the event
    /// there and is skipped (so an interrupted import resumes without duplicates), and a file
    /// that skips a position is refused. A line without a position is appended after the
    /// store's events.
    #[arg(value_name = "FILE")]
    input: PathBuf,
    /// Events per append (each append is atomic).
    #[arg(long, default_value_t = 1000)]
    batch: usize,
    /// Ignore the positions in the file: its events get the store's next positions (to add
    /// an export of a query, or events from another store, after the events a store holds).
    /// An interrupted import with this flag cannot resume: run again, it imports every line
    /// again.
    #[arg(long)]
    new_positions: bool,
    /// For a store without data subjects: import erased events as ordinary events with no
    /// data (type, tags and id kept, so positions stay the same) and erasure receipts as
    /// ordinary events. Without it, erased events are imported erased, which needs a store
    /// with data subjects.
    #[arg(long)]
    erased_as_empty: bool,
}

/// Where the events are: a store opened here, or a server.
enum Target {
    Dir(Box<Store>),
    Url(Remote),
}

impl Target {
    fn open(at: &Where) -> Result<Target, Failure> {
        if let Some(remote) = at.server.connect() {
            return remote.map(Target::Url).map_err(Failure::from);
        }
        match &at.store {
            Some(store) => {
                let options = Options {
                    subjects: at.subjects.options()?,
                    ..Options::default()
                };
                open_store(store, options).map(|s| Target::Dir(Box::new(s)))
            }
            None => Err("say where the events are: --store DIR|postgres://... or --url URL".into()),
        }
    }

    fn head(&mut self) -> Result<u64, String> {
        match self {
            Target::Dir(store) => Ok(store.head()),
            Target::Url(remote) => {
                let body = remote.call("GET", "/v1/head", Vec::new())?;
                let v: serde_json::Value =
                    serde_json::from_slice(&body).map_err(|e| e.to_string())?;
                v["head"]
                    .as_u64()
                    .ok_or_else(|| "the server sent no head".into())
            }
        }
    }

    /// Appends atomically: Ok(Ok(last position)) or Ok(Err(conflicting position)).
    /// `carried`: the events are an export's history, erasure receipts included
    /// ([`annals::AppendOptions::carried`]; a server takes no receipts from a client).
    fn append(
        &mut self,
        events: &[NewEvent],
        condition: Option<&AppendCondition>,
        carried: bool,
    ) -> Result<Result<u64, u64>, String> {
        let options = annals::AppendOptions {
            carried,
            ..annals::AppendOptions::default()
        };
        match self {
            Target::Dir(store) => {
                let mut append = store.appending(events).options(options);
                if let Some(condition) = condition {
                    append = append.condition(condition);
                }
                match append.wait() {
                    Ok(p) => Ok(Ok(p)),
                    Err(AppendError::ConditionFailed { position }) => Ok(Err(position)),
                    Err(e) => Err(e.to_string()),
                }
            }
            Target::Url(remote) => {
                let mut body = Vec::with_capacity(events.len() * 128);
                body.extend_from_slice(b"{\"events\":[");
                for (i, event) in events.iter().enumerate() {
                    if i > 0 {
                        body.push(b',');
                    }
                    write_new_event(&mut body, event)?;
                }
                body.push(b']');
                if let Some(c) = condition {
                    body.extend_from_slice(b",\"condition\":");
                    body.extend_from_slice(&serde_json::to_vec(c).map_err(|e| e.to_string())?);
                }
                body.push(b'}');
                let answer = remote.call("POST", "/v1/append", body)?;
                let v: serde_json::Value =
                    serde_json::from_slice(&answer).map_err(|e| e.to_string())?;
                if v["appendConditionFailed"] == true {
                    Ok(Err(v["conflictPosition"].as_u64().unwrap_or(0)))
                } else {
                    v["position"]
                        .as_u64()
                        .map(Ok)
                        .ok_or_else(|| format!("unexpected answer {v}"))
                }
            }
        }
    }

    /// Hands each matching event, as a JSON line, to `each`.
    fn read(
        &mut self,
        query: &Query,
        options: ReadOptions,
        each: impl FnMut(&[u8]) -> Result<bool, String>,
    ) -> Result<(), String> {
        match self {
            Target::Dir(store) => each_line(store.read(query, options), each),
            Target::Url(remote) => {
                let options = serde_json::to_string(&options).map_err(|e| e.to_string())?;
                let query = serde_json::to_string(query).map_err(|e| e.to_string())?;
                let path = format!(
                    "/v1/read?query={}&options={}",
                    percent(&query),
                    percent(&options)
                );
                remote.stream_lines(&path, each)
            }
        }
    }

    /// Follows the matching events after `after`, handing each to `each` until it says stop.
    fn tail(
        &mut self,
        query: &Query,
        after: u64,
        each: impl FnMut(&[u8]) -> Result<bool, String>,
    ) -> Result<(), String> {
        match self {
            Target::Dir(store) => each_line(store.subscribe(query, after), each),
            Target::Url(remote) => {
                let query = serde_json::to_string(query).map_err(|e| e.to_string())?;
                let path = format!("/v1/subscribe?query={}&after={after}", percent(&query));
                remote.stream_lines(&path, each)
            }
        }
    }

    /// Erases the data subject `tag` names (a server needs an admin key); answers the
    /// position of the erasure's receipt.
    fn erase(&mut self, tag: &str) -> Result<u64, String> {
        match self {
            Target::Dir(store) => store
                .erase_subject(tag)
                .map(|e| e.receipt)
                .map_err(|e| e.to_string()),
            Target::Url(remote) => {
                let body = serde_json::json!({ "tag": tag }).to_string();
                let answer = remote.call("POST", "/v1/admin/erase", body.into_bytes())?;
                let v: serde_json::Value =
                    serde_json::from_slice(&answer).map_err(|e| e.to_string())?;
                v["receipt"]
                    .as_u64()
                    .ok_or_else(|| format!("unexpected answer {v}"))
            }
        }
    }

    /// The data subjects of a store opened here (None inside when it keeps none); None for a
    /// server, which answers for its own when asked to erase.
    fn subjects(&self) -> Option<Option<&annals::SubjectOptions>> {
        match self {
            Target::Dir(store) => Some(store.options().subjects.as_ref()),
            Target::Url(_) => None,
        }
    }

    fn close(self) -> Result<(), String> {
        match self {
            Target::Dir(store) => store.close().map_err(|e| e.to_string()),
            Target::Url(_) => Ok(()),
        }
    }
}

/// Opens the store at a directory or PostgreSQL URL, naming it (without a password) in errors.
/// Its data subjects are the options' (`SubjectArgs`, the same flags for every command).
/// Opens a store for a command; unless the command gives its own admission check, with the
/// store's schema registry, so that an append made here is judged as a server judges it.
pub(crate) fn open_store(location: &str, mut options: Options) -> Result<Store, Failure> {
    if options.admission.is_none() {
        options.admission = Some(std::sync::Arc::new(annals::registry::Registry::new()));
    }
    Store::open_location(location, options).map_err(|e| {
        Failure::of_kind(
            e.kind(),
            format!(
                "cannot open {}: {e}",
                annals_server::config::redact_password(location)
            ),
        )
    })
}

/// Hands each event of a read or subscription, as a JSON line, to `each` until it says stop.
fn each_line<I>(
    events: Result<I, annals::ReadError>,
    mut each: impl FnMut(&[u8]) -> Result<bool, String>,
) -> Result<(), String>
where
    I: Iterator<Item = Result<annals::Event, annals::ReadError>>,
{
    let mut line = Vec::with_capacity(512);
    for event in events.map_err(|e| e.to_string())? {
        let event = event.map_err(|e| e.to_string())?;
        line.clear();
        wire::write_event(&mut line, &event);
        if !each(&line)? {
            break;
        }
    }
    Ok(())
}

/// Percent-encodes everything but unreserved characters (for query values and path segments).
pub(crate) fn percent(s: &str) -> String {
    use percent_encoding::{utf8_percent_encode, AsciiSet, NON_ALPHANUMERIC};
    const RESERVED: &AsciiSet = &NON_ALPHANUMERIC
        .remove(b'-')
        .remove(b'_')
        .remove(b'.')
        .remove(b'~');
    utf8_percent_encode(s, RESERVED).to_string()
}

/// An event as the HTTP API takes it: data that is not UTF-8 as base64 with its
/// `dataEncoding`, as reads answer it.
fn write_new_event(out: &mut Vec<u8>, event: &NewEvent) -> Result<(), String> {
    out.extend_from_slice(b"{\"type\":");
    wire::write_str(out, &event.event_type);
    out.extend_from_slice(b",\"tags\":[");
    for (i, tag) in event.tags.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        wire::write_str(out, tag);
    }
    out.extend_from_slice(b"],\"data\":");
    match std::str::from_utf8(&event.data) {
        Ok(data) => wire::write_str(out, data),
        Err(_) => {
            let data = base64::engine::general_purpose::STANDARD.encode(&event.data);
            wire::write_str(out, &data);
            out.extend_from_slice(b",\"dataEncoding\":\"base64\"");
        }
    }
    if let Some(id) = event.id {
        out.extend_from_slice(format!(",\"id\":\"{id}\"").as_bytes());
    }
    if !event.metadata.is_empty() {
        out.extend_from_slice(b",\"metadata\":");
        wire::write_metadata(out, &event.metadata);
    }
    out.push(b'}');
    Ok(())
}

/// One line of an import file: an event as `export` writes it (its time ignored).
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ImportEvent {
    #[serde(rename = "type")]
    event_type: String,
    #[serde(default)]
    tags: Vec<String>,
    /// Any JSON value: a string is the data itself, anything else stands for its compact
    /// JSON text.
    data: Box<RawValue>,
    #[serde(default)]
    id: Option<uuid::Uuid>,
    #[serde(default)]
    metadata: Option<Box<RawValue>>,
    #[serde(default, rename = "dataEncoding")]
    data_encoding: Option<String>,
    #[serde(default, rename = "metadataEncoding")]
    metadata_encoding: Option<String>,
    #[serde(default)]
    position: Option<u64>,
    /// An event whose data subject was erased: it has no data or metadata left.
    #[serde(default)]
    erased: bool,
    #[serde(default, rename = "appendedAt")]
    #[allow(dead_code)]
    appended_at: Option<u64>,
    /// What the event was checked against when it was appended (a server's export gives it):
    /// the store it goes to judges it again.
    #[serde(default)]
    #[allow(dead_code)]
    schema: Option<serde::de::IgnoredAny>,
}

/// An event line parsed: the event to append, and what the line says of it.
struct ImportLine {
    number: usize,
    event: NewEvent,
    /// The position the line gives (an export's lines carry theirs).
    position: Option<u64>,
    erased: bool,
}

impl ImportLine {
    /// Whether the line is the receipt of an erasure, which only a store's own erasure
    /// appends.
    fn is_receipt(&self) -> bool {
        self.event.event_type == annals::SUBJECT_ERASED_TYPE
    }
}

/// An event line for `append`, which takes no erased event (it has no data to append).
fn parse_event(line: &[u8], number: usize) -> Result<NewEvent, String> {
    let line = parse_line(line, number)?;
    if line.erased {
        return Err(format!(
            "line {number}: an erased event has no data to append; `annals import` takes an \
             export that holds erased events"
        ));
    }
    Ok(line.event)
}

fn parse_line(line: &[u8], number: usize) -> Result<ImportLine, String> {
    let e: ImportEvent =
        serde_json::from_slice(line).map_err(|err| format!("line {number}: {err}"))?;
    let raw = e.data.get();
    let text: Option<String> = if raw.starts_with('"') {
        Some(serde_json::from_str(raw).map_err(|err| format!("line {number}: data: {err}"))?)
    } else {
        None
    };
    let data = match (e.data_encoding.as_deref(), text) {
        (None | Some("utf8"), Some(text)) => Bytes::from(text.into_bytes()),
        (None | Some("utf8"), None) => Bytes::from(compact_json(raw).into_bytes()),
        (Some("base64"), Some(text)) => Bytes::from(
            base64::engine::general_purpose::STANDARD
                .decode(text)
                .map_err(|err| format!("line {number}: data: {err}"))?,
        ),
        (Some("base64"), None) => {
            return Err(format!(
                "line {number}: data with dataEncoding base64 must be a string"
            ))
        }
        (Some(other), _) => return Err(format!("line {number}: unknown dataEncoding {other:?}")),
    };
    let metadata = match (e.metadata, e.metadata_encoding.as_deref()) {
        (None, _) => Bytes::new(),
        (Some(m), None | Some("utf8")) => Bytes::copy_from_slice(m.get().as_bytes()),
        (Some(m), Some("base64")) => {
            let text: String = serde_json::from_str(m.get()).map_err(|_| {
                format!("line {number}: metadata with metadataEncoding base64 must be a string")
            })?;
            Bytes::from(
                base64::engine::general_purpose::STANDARD
                    .decode(text)
                    .map_err(|err| format!("line {number}: metadata: {err}"))?,
            )
        }
        (Some(_), Some(other)) => {
            return Err(format!("line {number}: unknown metadataEncoding {other:?}"))
        }
    };
    if e.erased && !(data.is_empty() && metadata.is_empty()) {
        return Err(format!(
            "line {number}: an erased event has no data or metadata, and this line gives some"
        ));
    }
    Ok(ImportLine {
        number,
        event: NewEvent {
            event_type: e.event_type,
            tags: e.tags,
            data,
            metadata,
            id: e.id,
        },
        position: e.position,
        erased: e.erased,
    })
}

/// Progress on standard error, at most four times a second, only on a terminal.
struct Progress {
    started: Instant,
    last: Instant,
    tty: bool,
    verb: &'static str,
}

impl Progress {
    fn new(verb: &'static str) -> Self {
        let tty = std::io::stderr().is_terminal();
        Progress {
            started: Instant::now(),
            last: Instant::now(),
            tty,
            verb,
        }
    }

    fn update(&mut self, events: u64) {
        if self.tty && self.last.elapsed() >= Duration::from_millis(250) {
            self.last = Instant::now();
            let rate = events as f64 / self.started.elapsed().as_secs_f64().max(1e-9);
            eprint!("\r{} {events} events ({rate:.0}/s)   ", self.verb);
        }
    }

    fn finish(&self, events: u64, detail: &str) {
        if self.tty {
            eprint!("\r");
        }
        let secs = self.started.elapsed().as_secs_f64();
        eprintln!(
            "{} {events} events in {secs:.2} s ({:.0} events/s){detail}",
            self.verb,
            events as f64 / secs.max(1e-9)
        );
    }
}

/// JSON text without the whitespace between its tokens (the text must be valid JSON; what is
/// inside strings is kept as written, and so is the order of an object's keys).
pub(crate) fn compact_json(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut in_string = false;
    let mut escaped = false;
    for c in text.chars() {
        if in_string {
            out.push(c);
            if escaped {
                escaped = false;
            } else if c == '\\' {
                escaped = true;
            } else if c == '"' {
                in_string = false;
            }
        } else if c == '"' {
            in_string = true;
            out.push(c);
        } else if !matches!(c, ' ' | '\t' | '\n' | '\r') {
            out.push(c);
        }
    }
    out
}

/// An event's data for a person at a terminal: JSON as compact JSON; other text as it is,
/// except that backslashes, control characters (which could move the cursor or change
/// colours), the characters that reorder text on screen, and bytes that are not UTF-8 are
/// escaped (`\\`, `\n`, `\u{1b}`, `\xff`), so that what is shown stands for one data only.
pub(crate) fn shown_data(data: &[u8]) -> String {
    if let Ok(text) = std::str::from_utf8(data) {
        if serde_json::from_str::<serde::de::IgnoredAny>(text).is_ok() {
            return compact_json(text);
        }
    }
    let mut out = String::with_capacity(data.len());
    for chunk in data.utf8_chunks() {
        for c in chunk.valid().chars() {
            match c {
                '\\' => out.push_str("\\\\"),
                '\n' => out.push_str("\\n"),
                '\r' => out.push_str("\\r"),
                '\t' => out.push_str("\\t"),
                c if c.is_control() || is_reordering(c) => {
                    out.push_str(&format!("\\u{{{:x}}}", c as u32))
                }
                c => out.push(c),
            }
        }
        for byte in chunk.invalid() {
            out.push_str(&format!("\\x{byte:02x}"));
        }
    }
    out
}

/// Unicode's bidirectional controls, which reorder the text around them on screen.
fn is_reordering(c: char) -> bool {
    matches!(c, '\u{200e}' | '\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
}

/// `text` cut to `width` characters, the last of them an ellipsis when it was longer.
pub(crate) fn cut(text: &str, width: usize) -> String {
    if text.chars().count() <= width {
        return text.to_owned();
    }
    let mut out: String = text.chars().take(width.saturating_sub(1)).collect();
    out.push('…');
    out
}

/// The width of the terminal standard output goes to; else `COLUMNS`; else 120.
fn terminal_width() -> usize {
    let mut size = libc::winsize {
        ws_row: 0,
        ws_col: 0,
        ws_xpixel: 0,
        ws_ypixel: 0,
    };
    // SAFETY: TIOCGWINSZ fills the winsize it is given, and only inspects the descriptor.
    let asked = unsafe { libc::ioctl(1, libc::TIOCGWINSZ, &mut size) };
    if asked == 0 && size.ws_col > 0 {
        return usize::from(size.ws_col);
    }
    std::env::var("COLUMNS")
        .ok()
        .and_then(|c| c.parse().ok())
        .unwrap_or(120)
}

/// The columns before the data: position, type and tags with their gaps.
const LEFT_COLUMNS: usize = 10 + 2 + 24 + 2 + 32 + 2;

fn print_line(out: &mut impl Write, line: &[u8], format: Format) -> Result<(), String> {
    let result = match format {
        Format::Ndjson => out.write_all(line).and_then(|_| out.write_all(b"\n")),
        Format::Table => {
            let v: serde_json::Value =
                serde_json::from_slice(line).map_err(|e| format!("bad event line: {e}"))?;
            let tags: Vec<&str> = v["tags"]
                .as_array()
                .map(|a| a.iter().filter_map(|t| t.as_str()).collect())
                .unwrap_or_default();
            let text = v["data"].as_str().unwrap_or("");
            let data = match v["dataEncoding"].as_str() {
                Some("base64") => base64::engine::general_purpose::STANDARD
                    .decode(text)
                    .map_err(|e| format!("bad event line: data: {e}"))?,
                _ => text.as_bytes().to_vec(),
            };
            let width = terminal_width().saturating_sub(LEFT_COLUMNS).max(16);
            // An erased event has no data left; an empty column would read as empty data.
            let shown = if v["erased"] == true {
                "(erased: its data subject was erased)".to_string()
            } else {
                cut(&shown_data(&data), width)
            };
            writeln!(
                out,
                "{:>10}  {:<24}  {:<32}  {}",
                v["position"].as_u64().unwrap_or(0),
                v["type"].as_str().unwrap_or(""),
                tags.join(","),
                shown
            )
        }
    };
    result.map_err(|e| e.to_string())
}

fn table_header(out: &mut impl Write, format: Format) -> Result<(), String> {
    if format == Format::Table {
        writeln!(
            out,
            "{:>10}  {:<24}  {:<32}  data",
            "position", "type", "tags"
        )
        .map_err(|e| e.to_string())?;
    }
    Ok(())
}

pub fn append(args: AppendArgs) -> Result<(), Failure> {
    let condition: Option<AppendCondition> = args
        .condition
        .as_deref()
        .map(|c| serde_json::from_str(c).map_err(|e| format!("--condition: {e}")))
        .transpose()?;
    let mut target = Target::open(&args.at)?;
    let report = |result: Result<u64, u64>| -> Result<(), String> {
        match result {
            Ok(position) => {
                println!("{}", serde_json::json!({ "position": position }));
                Ok(())
            }
            Err(position) => Err(format!(
                "the condition failed: the event at position {position} matches it; nothing was appended"
            )),
        }
    };
    if let Some(event_type) = args.event_type {
        let event = NewEvent {
            event_type,
            tags: args.tags,
            data: Bytes::from(args.data.into_bytes()),
            metadata: Bytes::new(),
            id: args.id,
        };
        return Ok(report(target.append(
            &[event],
            condition.as_ref(),
            false,
        )?)?);
    }
    let stdin = std::io::stdin();
    let mut batch = Vec::new();
    let mut last = None;
    for (i, line) in stdin.lock().lines().enumerate() {
        let line = line.map_err(|e| e.to_string())?;
        if line.trim().is_empty() {
            continue;
        }
        batch.push(parse_event(line.as_bytes(), i + 1)?);
        if batch.len() >= args.batch.max(1) {
            last = Some(target.append(&batch, condition.as_ref(), false)?);
            if let Some(Err(_)) = last {
                break;
            }
            batch.clear();
        }
    }
    if !batch.is_empty() {
        last = Some(target.append(&batch, condition.as_ref(), false)?);
    }
    match last {
        Some(result) => Ok(report(result)?),
        None => {
            Err("no events: give --type (and --tag, --data) or NDJSON on standard input".into())
        }
    }
}

pub fn read(args: ReadArgs) -> Result<(), Failure> {
    let query = args.query.query()?;
    let mut options = if args.backwards {
        ReadOptions::backwards()
    } else {
        ReadOptions::forwards()
    };
    options.from = args.from;
    options.after = args.after;
    options.limit = args.limit;
    let mut target = Target::open(&args.at)?;
    let stdout = std::io::stdout();
    let mut out = std::io::BufWriter::new(stdout.lock());
    table_header(&mut out, args.format)?;
    let format = args.format;
    target.read(&query, options, |line| {
        print_line(&mut out, line, format)?;
        Ok(true)
    })?;
    out.flush().map_err(|e| e.to_string())?;
    Ok(())
}

pub fn tail(args: TailArgs) -> Result<(), Failure> {
    let query = args.query.query()?;
    let mut target = Target::open(&args.at)?;
    let after = match args.after {
        Some(a) => a,
        None => target.head()?,
    };
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    table_header(&mut out, args.format)?;
    let mut seen = 0u64;
    let format = args.format;
    let count = args.count;
    target.tail(&query, after, |line| {
        print_line(&mut out, line, format)?;
        out.flush().map_err(|e| e.to_string())?;
        seen += 1;
        Ok(count.is_none_or(|c| seen < c))
    })?;
    Ok(())
}

pub fn export(args: ExportArgs) -> Result<(), Failure> {
    let query = args.query.query()?;
    let mut target = Target::open(&args.at)?;
    let sink: Box<dyn Write> = match &args.output {
        Some(path) => {
            Box::new(std::fs::File::create(path).map_err(|e| format!("{}: {e}", path.display()))?)
        }
        None => Box::new(std::io::stdout()),
    };
    let mut out = std::io::BufWriter::with_capacity(1 << 20, sink);
    let mut progress = Progress::new("exported");
    let mut n = 0u64;
    let mut last_position = 0;
    target.read(&query, ReadOptions::forwards(), |line| {
        out.write_all(line)
            .and_then(|_| out.write_all(b"\n"))
            .map_err(|e| e.to_string())?;
        n += 1;
        if let Some(p) = position_of(line) {
            last_position = p;
        }
        progress.update(n);
        Ok(true)
    })?;
    out.flush().map_err(|e| e.to_string())?;
    progress.finish(n, &format!(", through position {last_position}"));
    Ok(())
}

/// The position field of an event line, without parsing the rest.
fn position_of(line: &[u8]) -> Option<u64> {
    let at = line.windows(11).position(|w| w == b"\"position\":")? + 11;
    let digits = line[at..].iter().take_while(|b| b.is_ascii_digit()).count();
    std::str::from_utf8(&line[at..at + digits])
        .ok()?
        .parse()
        .ok()
}

pub fn import(args: ImportArgs) -> Result<(), Failure> {
    let reader: Box<dyn BufRead> = if args.input.as_os_str() == "-" {
        Box::new(std::io::BufReader::new(std::io::stdin()))
    } else {
        let file = std::fs::File::open(&args.input)
            .map_err(|e| format!("{}: {e}", args.input.display()))?;
        Box::new(std::io::BufReader::with_capacity(1 << 20, file))
    };
    let mut import = Import::new(&args);
    if let Err(e) = import.refuse_registry_lines() {
        return Err(import.failed(e));
    }
    for (i, line) in reader.lines().enumerate() {
        let taken = line
            .map_err(|e| format!("line {}: {e}", i + 1))
            .and_then(|line| {
                if line.trim().is_empty() {
                    return Ok(());
                }
                import.take(parse_line(line.as_bytes(), i + 1)?)
            });
        if let Err(e) = taken {
            return Err(import.failed(e));
        }
    }
    Ok(import.finish()?)
}

/// Whether the import carries the schema registry's events: only into a store opened here
/// that keeps the file's positions (a server takes none from a client, and at new positions
/// they would hold rules the target never judged by).
fn carries_registry(args: &ImportArgs) -> bool {
    args.at.server.url.is_none() && !args.new_positions
}

fn registry_refusal(line: &ImportLine) -> String {
    format!(
        "line {} holds an event of the schema registry ({}): only an import into a store opened here (--store) \
         that keeps the file's positions carries a registry; leave the registry's lines out, \
         import with --new-positions and register the schemas on the target (annals schema \
         put)",
        line.number, line.event.event_type
    )
}

/// What an import made to hold its store, judged before the store is opened. When the import
/// fails with nothing imported it is removed again, so that a failed import leaves no empty
/// store behind. A database is not judged (whether its tables were there before is not known
/// here); the store is opened only once the first line has parsed.
enum Made {
    /// The directory did not exist.
    Directory(PathBuf),
    /// The directory existed, empty.
    Contents(PathBuf),
}

impl Made {
    fn of(at: &Where) -> Option<Made> {
        if at.server.url.is_some() {
            return None;
        }
        let location = at.store.as_deref()?;
        if annals::is_database_url(location) {
            return None;
        }
        let dir = PathBuf::from(location);
        match std::fs::read_dir(&dir).map(|mut entries| entries.next().is_none()) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Some(Made::Directory(dir)),
            Ok(true) => Some(Made::Contents(dir)),
            _ => None,
        }
    }

    fn remove(self) -> std::io::Result<()> {
        match self {
            Made::Directory(dir) => match std::fs::remove_dir_all(&dir) {
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
                removed => removed,
            },
            Made::Contents(dir) => {
                for entry in std::fs::read_dir(&dir)? {
                    let path = entry?.path();
                    if path.is_dir() {
                        std::fs::remove_dir_all(&path)?;
                    } else {
                        std::fs::remove_file(&path)?;
                    }
                }
                Ok(())
            }
        }
    }
}

/// An import under way. The file is read as a log from position 1: each line's event keeps
/// the position the line gives; a line at or below the store's head is compared with the
/// event there and skipped, the others are appended in atomic batches, each only while the
/// store's head is the one the import knows. Unless `--erased-as-empty`, an erased event is
/// appended with no data under its subject's tag, and the receipt of an erasure is not
/// appended as it is (a store appends only its own) but done: the subject is erased in the
/// store, whose receipt then takes the line's position.
struct Import<'a> {
    args: &'a ImportArgs,
    /// Opened once the first line has parsed, so that a file that holds no events makes no
    /// store.
    target: Option<Target>,
    made: Option<Made>,
    /// The kind of the opening's failure, when the store could not be opened (its exit
    /// status is the import's).
    open_failed: Option<&'static str>,
    /// The store's head: its events, this import's included.
    head: u64,
    /// The events of the next append, and the line of the last of them.
    batch: Vec<NewEvent>,
    batch_line: usize,
    /// Lines at or below the head, to compare with the store's events at their positions.
    held: Vec<ImportLine>,
    /// The position of the previous line's event.
    previous: u64,
    /// The last line whose event is in the store (appended, found there, or erased).
    through_line: usize,
    found: u64,
    appended: u64,
    appends: u64,
    first: Option<u64>,
    last: u64,
    /// Erased events whose subject the store has not erased yet: line, position, tags.
    unerased: Vec<(usize, u64, Vec<String>)>,
    /// The receipts of the erasures this import made, by position.
    receipts: Vec<u64>,
    progress: Progress,
    /// A line of the registry's events was refused: the same import run again meets it.
    registry_refused: bool,
}

impl<'a> Import<'a> {
    fn new(args: &'a ImportArgs) -> Self {
        Import {
            args,
            target: None,
            made: None,
            open_failed: None,
            head: 0,
            batch: Vec::with_capacity(args.batch.clamp(1, 1 << 16)),
            batch_line: 0,
            held: Vec::new(),
            previous: 0,
            through_line: 0,
            found: 0,
            appended: 0,
            appends: 0,
            first: None,
            last: 0,
            unerased: Vec::new(),
            receipts: Vec::new(),
            progress: Progress::new("imported"),
            registry_refused: false,
        }
    }

    fn batch_max(&self) -> usize {
        self.args.batch.max(1)
    }

    fn open(&mut self) -> Result<(), String> {
        // Judged before the open: a store another process holds (locked) is its own, never
        // removed.
        let made = Made::of(&self.args.at);
        let target = match Target::open(&self.args.at) {
            Ok(target) => self.target.insert(target),
            Err(e) => {
                // What this open made goes again, unless another process holds the store (it
                // may have made the directory a moment ago): that is its own.
                if let Some(made) = made.filter(|_| e.kind() != "locked") {
                    let _ = made.remove();
                }
                self.open_failed = Some(e.kind());
                return Err(e.to_string());
            }
        };
        self.made = made;
        if self.args.erased_as_empty && matches!(target.subjects(), Some(Some(_))) {
            return Err(
                "--erased-as-empty is for a store without data subjects: this one keeps \
                 them, and an import into it keeps erased events erased"
                    .into(),
            );
        }
        self.head = target.head()?;
        Ok(())
    }

    /// An import that cannot carry the registry's events, of a regular file (standard input,
    /// a pipe or a device is read once): refused at the file's first registry line that would
    /// be appended, found before anything is imported. Into a server keeping the file's
    /// positions, a line at or below its head is compared, not appended, so the server is
    /// asked its head first. Only lines that may name a registry type are parsed.
    fn refuse_registry_lines(&mut self) -> Result<(), String> {
        let args = self.args;
        let regular = args.input.as_os_str() != "-"
            && std::fs::metadata(&args.input).is_ok_and(|m| m.is_file());
        if carries_registry(args) || !regular {
            return Ok(());
        }
        let file = std::fs::File::open(&args.input)
            .map_err(|e| format!("{}: {e}", args.input.display()))?;
        let reader = std::io::BufReader::with_capacity(1 << 20, file);
        for (i, line) in reader.split(b'\n').enumerate() {
            let line = line.map_err(|e| format!("line {}: {e}", i + 1))?;
            // A type's name may be written with escapes.
            let holds = |s: &[u8]| line.windows(s.len()).any(|w| w == s);
            if !holds(b"annals.Schema") && !holds(b"\\u") {
                continue;
            }
            // A line that does not parse is refused where the import reaches it.
            let Ok(parsed) = parse_line(&line, i + 1) else {
                continue;
            };
            if !annals::admission::is_registry_type(&parsed.event.event_type) {
                continue;
            }
            if let Some(position) = parsed.position.filter(|_| !args.new_positions) {
                if self.target.is_none() {
                    self.open()?;
                }
                if position <= self.head {
                    continue;
                }
            }
            self.registry_refused = true;
            return Err(registry_refusal(&parsed));
        }
        Ok(())
    }

    fn take(&mut self, mut line: ImportLine) -> Result<(), String> {
        if self.target.is_none() {
            self.open()?;
        }
        let next = self.head + self.batch.len() as u64 + 1;
        let position = match line.position.filter(|_| !self.args.new_positions) {
            None => next,
            Some(p) if p == self.previous + 1 => p,
            Some(p) if p > self.previous + 1 => {
                return Err(format!(
                    "line {}: position {p} follows position {}: the file skips positions (an \
                     export of a query?); give --new-positions to import its events at the \
                     store's next positions",
                    line.number, self.previous
                ))
            }
            Some(p) => {
                return Err(format!(
                    "line {}: position {p} does not follow position {}: an export's positions \
                     ascend one by one",
                    line.number, self.previous
                ))
            }
        };
        self.previous = position;
        if position <= self.head {
            line.position = Some(position);
            self.held.push(line);
            if self.held.len() >= self.batch_max() {
                self.compare()?;
            }
            return Ok(());
        }
        // Lines at or below the head come first (positions ascend), so none is held past here.
        self.compare()?;
        self.push(line, next)
    }

    fn push(&mut self, line: ImportLine, position: u64) -> Result<(), String> {
        if !carries_registry(self.args)
            && annals::admission::is_registry_type(&line.event.event_type)
        {
            self.registry_refused = true;
            return Err(registry_refusal(&line));
        }
        if !self.args.erased_as_empty && (line.erased || line.is_receipt()) {
            self.check_erasable(&line)?;
            if line.is_receipt() {
                return self.erase(&line, position);
            }
            self.unerased
                .push((line.number, position, line.event.tags.clone()));
        }
        self.batch.push(line.event);
        self.batch_line = line.number;
        if self.batch.len() >= self.batch_max() {
            self.flush()?;
        }
        Ok(())
    }

    /// Refuses an erased event or a receipt that the store opened here could not keep
    /// erased; a server answers for itself when asked to erase.
    fn check_erasable(&self, line: &ImportLine) -> Result<(), String> {
        let Some(subjects) = self.target.as_ref().and_then(Target::subjects) else {
            return Ok(());
        };
        let what = if line.is_receipt() {
            "is the receipt of an erasure"
        } else {
            "is an erased event"
        };
        match subjects {
            None => Err(format!(
                "line {} {what}, and this store keeps no data subjects, in which an erasure \
                 cannot hold: open it with the subject tags and master key it is to keep \
                 (--subject-tags, --master-key-file), or give --erased-as-empty to import \
                 erased events as ordinary events with no data",
                line.number
            )),
            Some(s) if !line.event.tags.iter().any(|t| s.is_subject(t)) => Err(format!(
                "line {} {what}, and none of its tags ({}) names a data subject of this store \
                 (its subject tag prefixes: {})",
                line.number,
                line.event.tags.join(", "),
                s.tag_prefixes.join(", ")
            )),
            Some(_) => Ok(()),
        }
    }

    /// Appends the batch. With positions kept, the append holds only while the store's head
    /// is the one this import knows, so that no event lands at another position than its
    /// line gives (another writer's append fails it instead).
    fn flush(&mut self) -> Result<(), String> {
        if self.batch.is_empty() {
            return Ok(());
        }
        let count = self.batch.len() as u64;
        let head = self.head;
        let condition =
            (!self.args.new_positions).then(|| AppendCondition::new(Query::all(), Some(head)));
        let Some(target) = self.target.as_mut() else {
            return Err("the store is not open".into());
        };
        // Into a store opened here, the lines are history carried as it is: not judged again
        // by the store's schemas, the registry's own events among them.
        let carried = self.args.erased_as_empty
            || (matches!(target, Target::Dir(_)) && !self.args.new_positions);
        let last = match target.append(&self.batch, condition.as_ref(), carried)? {
            Ok(last) => last,
            Err(p) => {
                return Err(format!(
                    "another writer appended to the store during the import (its event at \
                     position {p}), so the events of the lines through {} would not keep \
                     their positions; nothing of them was appended",
                    self.batch_line
                ))
            }
        };
        if !self.args.new_positions && last != head + count {
            return Err(format!(
                "the events of the lines through {} landed at positions {}..={last}, not \
                 after the store's head {head}: another writer appended meanwhile",
                self.batch_line,
                last + 1 - count
            ));
        }
        self.head = last;
        self.appended += count;
        self.appends += 1;
        self.first.get_or_insert(last + 1 - count);
        self.last = last;
        self.through_line = self.batch_line;
        self.batch.clear();
        self.progress.update(self.appended + self.found);
        Ok(())
    }

    /// Does the erasure a receipt line stands for: the events before it appended first, the
    /// subject erased in the store, its receipt at the line's position.
    fn erase(&mut self, line: &ImportLine, position: u64) -> Result<(), String> {
        let [tag] = line.event.tags.as_slice() else {
            return Err(format!(
                "line {}: the receipt of an erasure carries its subject's tag alone; this one \
                 has {} tags",
                line.number,
                line.event.tags.len()
            ));
        };
        self.flush()?;
        let Some(target) = self.target.as_mut() else {
            return Err("the store is not open".into());
        };
        let hint = match target {
            Target::Url(_) => {
                " (a server erases for an admin key only; into a server without data subjects, \
                 give --erased-as-empty)"
            }
            Target::Dir(_) => "",
        };
        let receipt = target.erase(tag).map_err(|e| {
            format!(
                "line {} is the receipt of {tag}'s erasure, and erasing {tag} in the store \
                 failed: {e}{hint}",
                line.number
            )
        })?;
        if receipt != position {
            return Err(format!(
                "line {}: {tag} is erased in the store with its receipt at position {receipt}, \
                 not at this line's position {position}",
                line.number
            ));
        }
        self.head = receipt;
        self.through_line = line.number;
        self.receipts.push(receipt);
        self.unerased
            .retain(|(_, _, tags)| !tags.iter().any(|t| t == tag));
        Ok(())
    }

    /// Compares the held lines with the store's events at their positions: the same type,
    /// tags and id, and the same data and metadata unless the event is erased (or the line is
    /// a receipt, whose data holds the time of the erasure).
    fn compare(&mut self) -> Result<(), String> {
        let (Some(first), Some(last)) = (self.held.first(), self.held.last()) else {
            return Ok(());
        };
        let from = first.position.unwrap_or(1);
        let to = last.position.unwrap_or(from);
        let mut options = ReadOptions::forwards();
        options.from = Some(from);
        options.limit = Some(to + 1 - from);
        let mut stored = Vec::with_capacity(self.held.len());
        let Some(target) = self.target.as_mut() else {
            return Err("the store is not open".into());
        };
        target.read(&Query::all(), options, |bytes| {
            stored.push(parse_line(bytes, 0).map_err(|e| format!("the store's event: {e}"))?);
            Ok(true)
        })?;
        let held = std::mem::take(&mut self.held);
        let erasing = !self.args.erased_as_empty;
        for line in &held {
            let position = line.position.unwrap_or(0);
            let event = usize::try_from(position - from)
                .ok()
                .and_then(|i| stored.get(i))
                .filter(|e| e.position == Some(position))
                .ok_or_else(|| {
                    format!(
                        "line {}: the store holds no event at position {position}",
                        line.number
                    )
                })?;
            // Data is not compared where it is gone (an erased event, or one the store is to
            // erase), nor in a receipt, whose data holds the time of its erasure.
            let data_gone = line.is_receipt() || event.erased || (line.erased && erasing);
            if let Some(difference) = difference(line, event, !data_gone) {
                return Err(format!(
                    "line {} is not the store's event at position {position} ({difference}): \
                     the store holds other events than the file's; import into an empty \
                     store, or give --new-positions to add the file's events after the \
                     store's",
                    line.number
                ));
            }
            if erasing && line.is_receipt() {
                // The store's own receipt is there: the subject is erased in it.
                self.unerased
                    .retain(|(_, _, tags)| !tags.iter().any(|t| line.event.tags.contains(t)));
            } else if erasing && line.erased && !event.erased {
                self.check_erasable(line)?;
                self.unerased
                    .push((line.number, position, line.event.tags.clone()));
            }
            self.found += 1;
            self.through_line = line.number;
        }
        self.progress.update(self.appended + self.found);
        Ok(())
    }

    fn finish(mut self) -> Result<(), String> {
        if let Err(e) = self.compare().and_then(|()| self.flush()) {
            return Err(self.abandon(e, true));
        }
        if !self.unerased.is_empty() {
            let e = self.unerased_events();
            return Err(self.abandon(e, false));
        }
        if let Some(target) = self.target.take() {
            target
                .close()
                .map_err(|e| format!("closing the store: {e}"))?;
        }
        let mut detail = String::new();
        if let Some(first) = self.first {
            detail.push_str(&format!(
                " in {} appends, positions {first}..={}",
                self.appends, self.last
            ));
        }
        if self.found > 0 {
            detail.push_str(&format!(
                "; {} lines found in the store already, skipped",
                self.found
            ));
        }
        if !self.receipts.is_empty() {
            detail.push_str(&format!(
                "; {} subjects erased, their receipts at positions {}",
                self.receipts.len(),
                listed(&self.receipts)
            ));
        }
        self.progress.finish(self.appended, &detail);
        Ok(())
    }

    /// Why erased events whose subject the file never erases were left readable.
    fn unerased_events(&self) -> String {
        let subjects = self.target.as_ref().and_then(Target::subjects).flatten();
        let mut tags: Vec<&str> = self
            .unerased
            .iter()
            .flat_map(|(_, _, tags)| tags)
            .filter(|t| subjects.is_none_or(|s| s.is_subject(t)))
            .map(String::as_str)
            .collect();
        tags.sort_unstable();
        tags.dedup();
        let positions: Vec<u64> = self.unerased.iter().map(|(_, p, _)| *p).collect();
        format!(
            "{} erased events (line {} first, positions {}) have no receipt of their erasure \
             after them in the file (as an export of a query may leave out): they are in the \
             store with no data, but not erased; erase their subject there (annals erase \
             TAG; their tags: {})",
            self.unerased.len(),
            self.unerased[0].0,
            listed(&positions),
            tags.join(", ")
        )
    }

    /// The import's failure on `error`: of the kind its target's opening gave, if that is
    /// what failed; resumable unless a registry line was refused, which the same import run
    /// again would meet.
    fn failed(self, error: String) -> Failure {
        let kind = self.open_failed.unwrap_or("failed");
        let resumable = !self.registry_refused;
        Failure::of_kind(kind, self.abandon(error, resumable))
    }

    /// The message of a failed import: `error`, then what the store holds of the file.
    /// `resumable`: whether running the same import again goes on where this one stopped.
    fn abandon(mut self, error: String, resumable: bool) -> String {
        let mut message = error;
        if let Some(target) = self.target.take() {
            if let Err(e) = target.close() {
                message.push_str(&format!("; closing the store failed: {e}"));
            }
        }
        if self.appended == 0 && self.found == 0 && self.receipts.is_empty() {
            message.push_str("; nothing was imported");
            if let Some(made) = self.made.take() {
                if let Err(e) = made.remove() {
                    message.push_str(&format!(
                        " (the empty store it began could not be removed: {e})"
                    ));
                }
            }
            return message;
        }
        let mut done = Vec::new();
        if self.found > 0 {
            done.push(format!("{} found there already", self.found));
        }
        if let Some(first) = self.first {
            done.push(format!(
                "{} appended at positions {first}..={}",
                self.appended, self.last
            ));
        }
        if !self.receipts.is_empty() {
            done.push(format!(
                "{} subjects erased, receipts at positions {}",
                self.receipts.len(),
                listed(&self.receipts)
            ));
        }
        message.push_str(&format!(
            "; the store holds the file's lines through line {} ({})",
            self.through_line,
            done.join(", ")
        ));
        if self.args.new_positions {
            message.push_str(
                "; with --new-positions an import run again imports every line again: import \
                 the lines after it only",
            );
        } else if resumable {
            message.push_str("; run the same import again to resume after them");
        }
        message
    }
}

/// What differs between a line and the store's event at its position, if anything.
fn difference(line: &ImportLine, stored: &ImportLine, data_too: bool) -> Option<&'static str> {
    if line.event.event_type != stored.event.event_type {
        Some("another type")
    } else if line.event.tags != stored.event.tags {
        Some("other tags")
    } else if line.event.id != stored.event.id {
        Some("another id")
    } else if data_too && line.event.data != stored.event.data {
        Some("other data")
    } else if data_too && line.event.metadata != stored.event.metadata {
        Some("other metadata")
    } else {
        None
    }
}

/// Positions for a message: the first few, then how many more.
fn listed(positions: &[u64]) -> String {
    const SHOWN: usize = 8;
    let mut text: Vec<String> = positions.iter().take(SHOWN).map(u64::to_string).collect();
    if positions.len() > SHOWN {
        text.push(format!("and {} more", positions.len() - SHOWN));
    }
    text.join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Goal: compaction drops only the whitespace between tokens, keeping what is inside
    /// strings (spaces, escaped quotes and backslashes) and the order of keys.
    #[test]
    fn compact_json_keeps_strings_and_key_order() {
        let raw = "{ \"b\" : [ 1 , 2 ],\n \"a\": \"x \\\" y\\\\\" , \"c\" : { } }";
        assert_eq!(compact_json(raw), r#"{"b":[1,2],"a":"x \" y\\","c":{}}"#);
    }

    /// Goal: what the table shows stands for one data only, and holds nothing that moves the
    /// cursor: JSON compact, text with its backslashes and control characters escaped, bytes
    /// that are not UTF-8 as \xNN, the characters that reorder text escaped.
    #[test]
    fn shown_data_is_unambiguous_and_inert() {
        assert_eq!(shown_data(b"{ \"a\": 1 }"), r#"{"a":1}"#);
        assert_eq!(shown_data(b"plain text"), "plain text");
        assert_eq!(shown_data(b"a\\nb"), r"a\\nb");
        assert_eq!(shown_data(b"a\nb"), r"a\nb");
        assert_eq!(shown_data(b"\x1b[2J"), r"\u{1b}[2J");
        assert_eq!(shown_data(b"\xff\x00"), r"\xff\u{0}");
        assert_eq!(shown_data("x\u{202e}y".as_bytes()), r"x\u{202e}y");
        assert_eq!(cut("abcdef", 4), "abc…");
        assert_eq!(cut("abc", 4), "abc");
    }
}
