//! The commands for people at a terminal: `append`, `read`, `tail`, `import`, `export`. Each
//! works on a data directory (`--dir`, the store opened in this process) or against a running
//! server (`--url`, `--api-key`). Events travel as the HTTP API's JSON lines in both cases.

use std::io::{BufRead, Write};
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

use crate::remote::{Remote, RemoteArgs};

#[derive(clap::Args)]
pub struct Where {
    /// The store, opened by this command: a data directory (not while a server holds it) or a
    /// PostgreSQL URL, postgres://user:password@host/database.
    #[arg(long, visible_alias = "dir", value_name = "DIR|URL")]
    store: Option<String>,
    #[command(flatten)]
    server: RemoteArgs,
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
    /// An id (UUID) that makes a retry idempotent.
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
    /// NDJSON events (as `annals export` writes them); `-` for standard input. Positions in the
    /// file are ignored: events get the next positions of the target store.
    #[arg(value_name = "FILE")]
    input: PathBuf,
    /// Events per append (each append is atomic).
    #[arg(long, default_value_t = 1000)]
    batch: usize,
}

/// Where the events are: a store opened here, or a server.
enum Target {
    Dir(Box<Store>),
    Url(Remote),
}

impl Target {
    fn open(at: &Where) -> Result<Target, String> {
        if let Some(remote) = at.server.connect() {
            return remote.map(Target::Url);
        }
        match &at.store {
            Some(store) => open_store(store, Options::default()).map(|s| Target::Dir(Box::new(s))),
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
    fn append(
        &mut self,
        events: &[NewEvent],
        condition: Option<&AppendCondition>,
    ) -> Result<Result<u64, u64>, String> {
        match self {
            Target::Dir(store) => match store.append(events, condition) {
                Ok(p) => Ok(Ok(p)),
                Err(AppendError::ConditionFailed { position }) => Ok(Err(position)),
                Err(e) => Err(e.to_string()),
            },
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
}

/// Opens the store at a directory or PostgreSQL URL, naming it (without a password) in errors.
/// The data subjects of `ANNALS_SUBJECT_TAGS` and `ANNALS_MASTER_KEY_FILE` apply unless the
/// options name their own.
pub(crate) fn open_store(location: &str, mut options: Options) -> Result<Store, String> {
    if options.subjects.is_none() {
        options.subjects = crate::subjects::subjects(None, None)?;
    }
    Store::open_location(location, options).map_err(|e| {
        format!(
            "cannot open {}: {e}",
            annals_server::config::redact_password(location)
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
    let mut out = String::with_capacity(s.len() * 2);
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-_.~".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// An event as the HTTP API takes it.
fn write_new_event(out: &mut Vec<u8>, event: &NewEvent) -> Result<(), String> {
    let data = std::str::from_utf8(&event.data)
        .map_err(|_| "event data that is not UTF-8 cannot travel over HTTP; use --dir")?;
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
    wire::write_str(out, data);
    if let Some(id) = event.id {
        out.extend_from_slice(format!(",\"id\":\"{id}\"").as_bytes());
    }
    if !event.metadata.is_empty() {
        out.extend_from_slice(b",\"metadata\":");
        if serde_json::from_slice::<serde::de::IgnoredAny>(&event.metadata).is_ok() {
            out.extend_from_slice(&event.metadata);
        } else {
            wire::write_str(out, &String::from_utf8_lossy(&event.metadata));
        }
    }
    out.push(b'}');
    Ok(())
}

/// One line of an import file: an event as `export` writes it (position and time ignored).
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
    #[serde(default)]
    #[allow(dead_code)]
    position: Option<u64>,
    #[serde(default, rename = "appendedAt")]
    #[allow(dead_code)]
    appended_at: Option<u64>,
}

fn parse_event(line: &[u8], number: usize) -> Result<NewEvent, String> {
    let e: ImportEvent =
        serde_json::from_slice(line).map_err(|err| format!("line {number}: {err}"))?;
    let raw = e.data.get();
    let text: Option<String> = if raw.starts_with('"') {
        Some(serde_json::from_str(raw).map_err(|err| format!("line {number}: data: {err}"))?)
    } else {
        None
    };
    let data = match (e.data_encoding.as_deref(), text) {
        (None, Some(text)) => Bytes::from(text.into_bytes()),
        (None, None) => Bytes::from(compact_json(raw).into_bytes()),
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
    Ok(NewEvent {
        event_type: e.event_type,
        tags: e.tags,
        data,
        metadata: e
            .metadata
            .map(|m| Bytes::copy_from_slice(m.get().as_bytes()))
            .unwrap_or_default(),
        id: e.id,
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
        // SAFETY: isatty only inspects the descriptor.
        let tty = unsafe { libc::isatty(2) } == 1;
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
            writeln!(
                out,
                "{:>10}  {:<24}  {:<32}  {}",
                v["position"].as_u64().unwrap_or(0),
                v["type"].as_str().unwrap_or(""),
                tags.join(","),
                cut(&shown_data(&data), width)
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

pub fn append(args: AppendArgs) -> Result<(), String> {
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
        return report(target.append(&[event], condition.as_ref())?);
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
            last = Some(target.append(&batch, condition.as_ref())?);
            if let Some(Err(_)) = last {
                break;
            }
            batch.clear();
        }
    }
    if !batch.is_empty() {
        last = Some(target.append(&batch, condition.as_ref())?);
    }
    match last {
        Some(result) => report(result),
        None => {
            Err("no events: give --type (and --tag, --data) or NDJSON on standard input".into())
        }
    }
}

pub fn read(args: ReadArgs) -> Result<(), String> {
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
    out.flush().map_err(|e| e.to_string())
}

pub fn tail(args: TailArgs) -> Result<(), String> {
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
    })
}

pub fn export(args: ExportArgs) -> Result<(), String> {
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

pub fn import(args: ImportArgs) -> Result<(), String> {
    let reader: Box<dyn BufRead> = if args.input.as_os_str() == "-" {
        Box::new(std::io::BufReader::new(std::io::stdin()))
    } else {
        let file = std::fs::File::open(&args.input)
            .map_err(|e| format!("{}: {e}", args.input.display()))?;
        Box::new(std::io::BufReader::with_capacity(1 << 20, file))
    };
    let mut target = Target::open(&args.at)?;
    let mut progress = Progress::new("imported");
    let mut batch = Vec::with_capacity(args.batch.max(1));
    let mut n = 0u64;
    let mut appends = 0u64;
    let mut first = None;
    let mut last = 0;
    let mut flush = |batch: &mut Vec<NewEvent>, n: &mut u64| -> Result<(), String> {
        if batch.is_empty() {
            return Ok(());
        }
        let position = target
            .append(batch, None)?
            .map_err(|p| format!("unexpected conflict at {p}"))?;
        first.get_or_insert(position + 1 - batch.len() as u64);
        last = position;
        appends += 1;
        *n += batch.len() as u64;
        batch.clear();
        Ok(())
    };
    for (i, line) in reader.lines().enumerate() {
        let line = line.map_err(|e| e.to_string())?;
        if line.trim().is_empty() {
            continue;
        }
        batch.push(parse_event(line.as_bytes(), i + 1).map_err(|e| {
            format!(
                "{e} (events before line {} were imported)",
                i + 1 - batch.len()
            )
        })?);
        if batch.len() >= args.batch.max(1) {
            flush(&mut batch, &mut n)?;
            progress.update(n);
        }
    }
    flush(&mut batch, &mut n)?;
    let detail = match first {
        Some(f) => format!(" in {appends} appends, positions {f}..={last}"),
        None => String::new(),
    };
    progress.finish(n, &detail);
    Ok(())
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
