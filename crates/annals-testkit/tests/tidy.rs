//! Keeps the documents true mechanically, over every file git tracks:
//! - every path a document or a comment names (a document under docs/, a source file, a
//!   Markdown link) is a file of the repository;
//! - every decision record cited (`R12`) is a record of docs/DECISIONS.md, every matching rule
//!   cited beside docs/EXCHANGE.md (`M8`) one of its rules, and no two documents define records
//!   of one series;
//! - every format version constant in the code is the version docs/internals/data-directory.md
//!   gives;
//! - the README's durability table has one whole row per class;
//! - nothing cites a document outside the repository;
//! - every public function of the library is called or tested;
//! - no test file passes a size cap;
//! - every test says its goal in its doc comment.
//!
//! No crate's modules import each other in a circle of more than two files: tidy_imports.rs.
//! Each check collects every finding before it fails, so one run lists all the drift.
mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;

use common::{code_of, root, tracked_text};

/// The words of a text as path-like tokens: runs of letters, digits and `_./-`.
fn tokens(text: &str) -> impl Iterator<Item = &str> {
    text.split(|c: char| !(c.is_ascii_alphanumeric() || "_./-".contains(c)))
        .map(|t| t.trim_end_matches(['.', '-']))
        .filter(|t| !t.is_empty())
}

/// Whether a token names a file: a path with a file kind, or the name of a document or source.
fn names_a_file(token: &str) -> bool {
    const KINDS: [&str; 10] = [
        ".md", ".rs", ".toml", ".py", ".mjs", ".sh", ".proto", ".yaml", ".png", ".json",
    ];
    if token.starts_with('/') || token.starts_with("//") || token.contains("..//") {
        return false;
    }
    let kind = KINDS
        .iter()
        .any(|k| token.ends_with(k) && token.len() > k.len());
    // A bare name (no directory) counts only for documents and sources: `x.json` in code is
    // mostly a method call.
    kind && (token.contains('/') || token.ends_with(".md") || token.ends_with(".rs"))
}

/// Goal: no document or comment names a file that is not in the repository. A name resolves
/// from the repository's root, from the naming file's directory, or as the tail of a tracked
/// path (`writer/mod.rs` in crates/annals/src).
#[test]
fn every_named_file_exists() {
    let files = tracked_text();
    let out = Command::new("git")
        .args(["ls-files"])
        .current_dir(root())
        .output()
        .unwrap();
    let all: Vec<String> = String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(str::to_string)
        .collect();
    let exists = |from: &str, name: &str| -> bool {
        let dir = Path::new(from).parent().unwrap_or(Path::new(""));
        let relative = normalize(&dir.join(name));
        if let Some(relative) = &relative {
            if all.iter().any(|p| {
                Path::new(p) == relative || p.starts_with(&format!("{}/", relative.display()))
            }) {
                return true;
            }
        }
        if name.starts_with("../") {
            // Relative to the naming file only; outside the repository it names nothing here.
            return false;
        }
        let name = name.trim_start_matches("./");
        all.iter()
            .any(|p| p == name || p.ends_with(&format!("/{name}")))
    };
    let mut missing = Vec::new();
    for (path, text) in &files {
        for (n, line) in text.lines().enumerate() {
            for token in tokens(line).filter(|t| names_a_file(t)) {
                if !exists(path, token) {
                    missing.push(format!("{path}:{}: {token}", n + 1));
                }
            }
        }
    }
    assert!(
        missing.is_empty(),
        "named files that are not in the repository:\n{}",
        missing.join("\n")
    );
}

/// `a/b/../c` as `a/c`; None when it climbs out of the repository.
fn normalize(path: &Path) -> Option<PathBuf> {
    let mut parts: Vec<&std::ffi::OsStr> = Vec::new();
    for part in path.components() {
        match part {
            std::path::Component::ParentDir => {
                parts.pop()?;
            }
            std::path::Component::CurDir => {}
            other => parts.push(other.as_os_str()),
        }
    }
    Some(parts.iter().collect())
}

/// The records a document defines, by series: `## R12.` headings and `- **M8.` rules.
fn defined_records(files: &[(String, String)]) -> BTreeMap<char, BTreeMap<u32, Vec<String>>> {
    let mut series: BTreeMap<char, BTreeMap<u32, Vec<String>>> = BTreeMap::new();
    for (path, text) in files.iter().filter(|(p, _)| p.ends_with(".md")) {
        for line in text.lines() {
            let rest = line
                .strip_prefix("## ")
                .or_else(|| line.strip_prefix("- **"))
                .or_else(|| line.strip_prefix("**"));
            let Some(rest) = rest else { continue };
            let mut chars = rest.chars();
            let Some(letter) = chars.next().filter(char::is_ascii_uppercase) else {
                continue;
            };
            let digits: String = chars.clone().take_while(char::is_ascii_digit).collect();
            let after = chars.as_str().get(digits.len()..).unwrap_or("");
            if digits.is_empty() || !(after.starts_with('.') || after.starts_with(' ')) {
                continue;
            }
            series
                .entry(letter)
                .or_default()
                .entry(digits.parse().unwrap())
                .or_default()
                .push(path.clone());
        }
    }
    series
}

/// The number of a citation token like `R12`, for the given letter.
fn cited(token: &str, letter: char) -> Option<u32> {
    let digits = token.strip_prefix(letter)?;
    (!digits.is_empty() && digits.len() <= 3 && digits.chars().all(|c| c.is_ascii_digit()))
        .then(|| digits.parse().unwrap())
}

/// Goal: a decision record or matching rule cited anywhere exists, and each series of records
/// is defined by one document, each record once.
#[test]
fn every_cited_record_exists_and_series_do_not_share_numbers() {
    let files = tracked_text();
    let series = defined_records(&files);
    let mut problems = Vec::new();
    for (letter, records) in &series {
        let owners: BTreeSet<&String> = records.values().flatten().collect();
        if owners.len() > 1 {
            problems.push(format!("series {letter} is defined by {owners:?}"));
        }
        for (number, places) in records {
            if places.len() > 1 {
                problems.push(format!(
                    "{letter}{number} is defined {} times",
                    places.len()
                ));
            }
        }
    }
    let decisions = series.get(&'R').cloned().unwrap_or_default();
    assert!(
        decisions
            .values()
            .flatten()
            .all(|p| p == "docs/DECISIONS.md")
            && !decisions.is_empty(),
        "the decision records (R) are docs/DECISIONS.md's"
    );
    let rules = series.get(&'M').cloned().unwrap_or_default();
    assert!(
        rules.values().flatten().all(|p| p == "docs/EXCHANGE.md") && !rules.is_empty(),
        "the matching rules (M) are docs/EXCHANGE.md's"
    );
    for (path, text) in &files {
        let about_rules = path == "docs/EXCHANGE.md" || text.contains("EXCHANGE.md");
        for (n, line) in text.lines().enumerate() {
            for token in line.split(|c: char| !c.is_ascii_alphanumeric()) {
                if let Some(number) = cited(token, 'R') {
                    if !decisions.contains_key(&number) {
                        problems.push(format!(
                            "{path}:{}: R{number} is not a decision record",
                            n + 1
                        ));
                    }
                }
                if let Some(number) = cited(token, 'M').filter(|_| about_rules) {
                    if !rules.contains_key(&number) {
                        problems.push(format!(
                            "{path}:{}: M{number} is not a matching rule",
                            n + 1
                        ));
                    }
                }
            }
        }
    }
    assert!(problems.is_empty(), "records:\n{}", problems.join("\n"));
}

/// The number in parentheses right after each place `anchor` occurs in `text`.
fn numbers_after(text: &str, anchor: &str) -> Vec<u32> {
    text.match_indices(anchor)
        .map(|(at, _)| {
            let rest = &text[at + anchor.len()..];
            let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
            digits
                .parse()
                .unwrap_or_else(|_| panic!("no number after {anchor:?}"))
        })
        .collect()
}

/// The value of `const NAME: T = value;` in a source file.
fn constant(path: &str, name: &str) -> u32 {
    let text = std::fs::read_to_string(root().join(path)).unwrap();
    let at = text
        .find(&format!("const {name}:"))
        .unwrap_or_else(|| panic!("{path} has no constant {name}"));
    let value = text[at..].split('=').nth(1).unwrap();
    value
        .trim()
        .trim_end_matches(|c: char| !c.is_ascii_digit())
        .split(';')
        .next()
        .unwrap()
        .trim()
        .parse()
        .unwrap_or_else(|e| panic!("{path}: {name}: {e}"))
}

/// Goal: every format version the code writes is the one the data directory's document gives,
/// at every place it gives it.
#[test]
fn format_versions_match_the_data_directory_document() {
    let doc = std::fs::read_to_string(root().join("docs/internals/data-directory.md")).unwrap();
    let table: [(&str, &str, &[&str]); 10] = [
        (
            "crates/annals/src/segment.rs",
            "SEGMENT_VERSION",
            &[
                "the log, in segments                        (version ",
                "magic \"ANNALSEG\"   8  version u32 (",
            ],
        ),
        (
            "crates/annals/src/record.rs",
            "RECORD_VERSION",
            &["magic u32 \"ANRC\"    4  version u8 ("],
        ),
        (
            "crates/annals/src/checkpoint.rs",
            "VERSION",
            &[
                "the indexes at a published head             (version ",
                "magic \"ANNALCKP\", version u32 (",
            ],
        ),
        (
            "crates/annals/src/readmodel/checkpoints.rs",
            "VERSION",
            &[
                "one read model's state and position        (version ",
                "magic \"ANNALSRM\", format version u32 (",
            ],
        ),
        (
            "crates/annals-exchange/src/engine/snapshot.rs",
            "VERSION",
            &[
                "the exchange's state (version ",
                "magic \"ANXS\", version u32 (",
            ],
        ),
        (
            "crates/annals-exchange/src/codec.rs",
            "VERSION",
            &["with the encoding version ("],
        ),
        (
            "crates/annals/src/archive.rs",
            "ARCHIVE_VERSION",
            &[
                "magic \"ANNALSBK\"   8  version u32 (",
                "share one layout (object version ",
                "the manifest: {\"format\": ",
            ],
        ),
        (
            "crates/annals/src/saved.rs",
            "VERSION",
            &["magic \"ANNALSST\", format version u32 ("],
        ),
        (
            "crates/annals/src/shelf/files.rs",
            "FORMAT",
            &[
                "decisions' snapshots  (version ",
                "magic \"ANNALSSH\", format version u32 (",
            ],
        ),
        (
            "crates/annals/src/postgres/sql.rs",
            "SCHEMA_VERSION",
            &["schema version in `annals_schema` (version "],
        ),
    ];
    let mut problems = Vec::new();
    for (path, name, anchors) in table {
        let code = constant(path, name);
        for anchor in anchors {
            let given = numbers_after(&doc, anchor);
            if given.is_empty() {
                problems.push(format!("the document no longer says {anchor:?}"));
            }
            for number in given.into_iter().filter(|n| *n != code) {
                problems.push(format!(
                    "{path} {name} is {code}; the document says {number} at {anchor:?}"
                ));
            }
        }
    }
    // The kept mirror's marker carries its version in its first word.
    let mirror = std::fs::read_to_string(root().join("crates/annals/src/kept.rs")).unwrap();
    let magic = mirror
        .split("const MAGIC: &str = \"")
        .nth(1)
        .and_then(|rest| rest.split('"').next())
        .expect("kept.rs's MAGIC");
    if !doc.contains(&format!("`{magic}`")) {
        problems.push(format!(
            "the document does not give the mirror's marker `{magic}`"
        ));
    }
    assert!(
        problems.is_empty(),
        "format versions:\n{}",
        problems.join("\n")
    );
}

/// The storage crate's source files, as (path relative to crates/annals/src, text).
fn storage_sources() -> Vec<(String, String)> {
    let src = root().join("crates/annals/src");
    let mut files = Vec::new();
    let mut stack = vec![src.clone()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                stack.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                let relative = path.strip_prefix(&src).unwrap().display().to_string();
                files.push((relative, std::fs::read_to_string(&path).unwrap()));
            }
        }
    }
    files
}

/// The storage crate's modules and the modules each imports (`crate::name`), from its source
/// files without comments and without the test module at a file's end.
fn storage_imports() -> BTreeMap<String, BTreeSet<String>> {
    let mut imports: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (relative, text) in storage_sources() {
        if relative == "lib.rs" || relative.starts_with("bin/") {
            continue;
        }
        let module = relative
            .split('/')
            .next()
            .unwrap()
            .trim_end_matches(".rs")
            .to_string();
        let code = text
            .split("#[cfg(test)]\nmod tests")
            .next()
            .unwrap()
            .lines()
            .map(|line| line.split("//").next().unwrap())
            .collect::<Vec<_>>()
            .join("\n");
        let used = imports.entry(module.clone()).or_default();
        for (at, _) in code.match_indices("crate::") {
            let rest = &code[at + "crate::".len()..];
            let names: Vec<&str> = if let Some(group) = rest.strip_prefix('{') {
                let group = &group[..group.find('}').unwrap_or(group.len())];
                group.split(',').collect()
            } else {
                vec![rest]
            };
            for name in names {
                let name: String = name
                    .trim()
                    .chars()
                    .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                    .collect();
                if !name.is_empty() && name != module {
                    used.insert(name);
                }
            }
        }
    }
    imports
}

/// The layer table of docs/ARCHITECTURE.md: each module's layer number.
fn layer_table() -> BTreeMap<String, u32> {
    let doc = std::fs::read_to_string(root().join("docs/ARCHITECTURE.md")).unwrap();
    let table = doc
        .split("### Layers")
        .nth(1)
        .expect("docs/ARCHITECTURE.md has a section \"### Layers\"");
    let mut layers = BTreeMap::new();
    for row in table
        .lines()
        .skip_while(|l| !l.starts_with('|'))
        .take_while(|l| l.starts_with('|'))
    {
        let cells: Vec<&str> = row.split('|').map(str::trim).collect();
        let Some(number) = cells
            .get(1)
            .and_then(|c| c.split(' ').next()?.parse::<u32>().ok())
        else {
            continue;
        };
        for module in cells[2].split(',') {
            layers.insert(module.trim().trim_matches('`').to_string(), number);
        }
    }
    layers
}

/// Goal: the layer table of docs/ARCHITECTURE.md is the storage crate's import graph: every
/// module is in it, none imports a module of a higher layer, and no import loop joins more
/// than two modules.
#[test]
fn the_storage_crate_is_layered_as_documented() {
    let imports = storage_imports();
    let layers = layer_table();
    let mut problems = Vec::new();
    for (module, used) in &imports {
        let Some(own) = layers.get(module) else {
            problems.push(format!("{module} is not in the layer table"));
            continue;
        };
        for other in used {
            match layers.get(other) {
                Some(layer) if layer > own => problems.push(format!(
                    "{module} (layer {own}) imports {other} (layer {layer})"
                )),
                Some(_) => {}
                // `crate::files` and the like: what lib.rs itself defines.
                None if !imports.contains_key(other) => {}
                None => problems.push(format!("{other} is not in the layer table")),
            }
        }
    }
    for module in layers.keys() {
        if !imports.contains_key(module) {
            problems.push(format!(
                "the layer table names {module}, which is not a module"
            ));
        }
    }
    // Loops: the modules each module reaches; two that reach each other are in one loop.
    let reach = |from: &str| -> BTreeSet<String> {
        let mut seen = BTreeSet::new();
        let mut todo = vec![from.to_string()];
        while let Some(m) = todo.pop() {
            for next in imports.get(&m).into_iter().flatten() {
                if imports.contains_key(next) && seen.insert(next.clone()) {
                    todo.push(next.clone());
                }
            }
        }
        seen
    };
    let reached: BTreeMap<&String, BTreeSet<String>> =
        imports.keys().map(|m| (m, reach(m))).collect();
    for (module, from_it) in &reached {
        let in_loop: BTreeSet<&String> = from_it
            .iter()
            .filter(|other| {
                reached
                    .get(other)
                    .is_some_and(|back| back.contains(*module))
            })
            .collect();
        if in_loop.len() > 2 {
            problems.push(format!("{module} is in an import loop with {in_loop:?}"));
        }
    }
    assert!(problems.is_empty(), "layers:\n{}", problems.join("\n"));
}

/// Goal: a library user on segment files compiles no database client, TLS stack or async
/// runtime: they come only with the `annals` crate's feature `postgres`.
#[test]
fn the_library_alone_needs_no_database_client() {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let out = Command::new(cargo)
        .args(["tree", "-p", "annals", "-e", "normal", "--prefix", "none"])
        .current_dir(root())
        .output()
        .expect("cargo tree");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let tree = String::from_utf8(out.stdout).unwrap();
    let packages: BTreeSet<&str> = tree
        .lines()
        .filter_map(|line| line.split(' ').next())
        .collect();
    assert!(
        packages.contains("crc32c"),
        "cargo tree listed the library's dependencies"
    );
    let unwanted: Vec<&&str> = packages
        .iter()
        .filter(|p| {
            ["postgres", "rustls", "aws-lc", "tokio"]
                .iter()
                .any(|u| p.contains(u))
        })
        .collect();
    assert!(
        unwanted.is_empty(),
        "the library alone depends on {unwanted:?}"
    );
}

/// Goal: the storage crate stays readable file by file: no source file over 900 lines, and no
/// two types (structs, enums, traits, aliases) of one name.
#[test]
fn storage_files_are_short_and_type_names_unique() {
    let mut problems = Vec::new();
    let mut types: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for (relative, text) in storage_sources() {
        let lines = text.lines().count();
        if lines > 900 {
            problems.push(format!("{relative} has {lines} lines"));
        }
        for line in text.lines() {
            let declaration = line
                .trim_start()
                .trim_start_matches("pub(crate) ")
                .trim_start_matches("pub(super) ")
                .trim_start_matches("pub ");
            for kind in ["struct ", "enum ", "trait ", "type "] {
                if let Some(rest) = declaration.strip_prefix(kind) {
                    let name: String = rest
                        .chars()
                        .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                        .collect();
                    // Associated types (`type Item`) inside impls and traits are not
                    // declarations of their own.
                    let associated = kind == "type " && line.starts_with(' ');
                    if !name.is_empty() && !associated {
                        types.entry(name).or_default().push(relative.clone());
                    }
                }
            }
        }
    }
    for (name, places) in types {
        if places.len() > 1 {
            problems.push(format!("{name} is declared in {places:?}"));
        }
    }
    assert!(
        problems.is_empty(),
        "storage crate:\n{}",
        problems.join("\n")
    );
}

/// The cells of a Markdown table row: the text between its `|`s, a `|` inside a code span or
/// escaped (`\|`) not counting as a border.
fn table_cells(row: &str) -> Vec<String> {
    let mut cells = Vec::new();
    let mut cell = String::new();
    let (mut code, mut escaped) = (false, false);
    for c in row.trim().trim_start_matches('|').chars() {
        match c {
            '|' if !code && !escaped => cells.push(std::mem::take(&mut cell)),
            _ => cell.push(c),
        }
        code ^= c == '`';
        escaped = c == '\\';
    }
    if !cell.trim().is_empty() {
        cells.push(cell);
    }
    cells.into_iter().map(|c| c.trim().to_string()).collect()
}

/// Goal: the README's durability table promises each class once and whole. Method: read the
/// first table under "## Durability" and require one row per class D0 to D4, each with as many
/// cells as the header (a row glued onto another, or a cell lost, changes both).
#[test]
fn the_durability_table_has_one_whole_row_per_class() {
    let readme = std::fs::read_to_string(root().join("README.md")).unwrap();
    let section = readme
        .split("\n## Durability\n")
        .nth(1)
        .expect("README.md has a section \"## Durability\"");
    let section = section.split("\n## ").next().unwrap();
    let rows: Vec<&str> = section
        .lines()
        .skip_while(|l| !l.starts_with('|'))
        .take_while(|l| l.starts_with('|'))
        .collect();
    assert!(rows.len() > 2, "the durability section has no table");
    let header = table_cells(rows[0]).len();
    let mut problems = Vec::new();
    let mut classes: BTreeMap<String, usize> = BTreeMap::new();
    for row in &rows[2..] {
        let cells = table_cells(row);
        if cells.len() != header {
            problems.push(format!(
                "a row has {} cells under a header of {header}: {row}",
                cells.len()
            ));
        }
        let class: String = cells
            .first()
            .map(|c| {
                c.chars()
                    .take_while(|ch| ch.is_ascii_alphanumeric())
                    .collect()
            })
            .unwrap_or_default();
        *classes.entry(class).or_default() += 1;
    }
    let expected: BTreeMap<String, usize> = (0..=4).map(|n| (format!("D{n}"), 1)).collect();
    if classes != expected {
        problems.push(format!(
            "the rows' classes are {classes:?}, not D0 to D4 once each"
        ));
    }
    assert!(
        problems.is_empty(),
        "README.md's durability table:\n{}",
        problems.join("\n")
    );
}

/// Goal: the repository explains itself: no document or comment cites a document a reader of
/// the repository cannot open, such as the starting documents the project was seeded from or
/// notes kept beside the checkout. Method: look for the phrases such citations take, and for
/// relative paths that climb out of the repository.
#[test]
fn nothing_cites_a_document_outside_the_repository() {
    // How the starting documents get cited. A random seed is not one of them: tests speak of
    // "the seed" they print, so only the documents' own names are refused.
    let phrases = ["the seed's", "seed document", "seeds/"];
    let mut problems = Vec::new();
    for (path, text) in tracked_text() {
        // This file names the phrases it looks for.
        if path == "crates/annals-testkit/tests/tidy.rs" {
            continue;
        }
        let dir = Path::new(&path).parent().unwrap_or(Path::new(""));
        for (n, line) in text.lines().enumerate() {
            let lower = line.to_lowercase();
            for phrase in phrases.iter().filter(|p| lower.contains(*p)) {
                problems.push(format!("{path}:{}: cites {phrase:?}", n + 1));
            }
            for token in tokens(line).filter(|t| t.starts_with("../")) {
                if normalize(&dir.join(token)).is_none() {
                    problems.push(format!("{path}:{}: {token} is outside", n + 1));
                }
            }
        }
    }
    assert!(
        problems.is_empty(),
        "citations of documents outside the repository (say the fact in the project's own \
         words):\n{}",
        problems.join("\n")
    );
}

/// The identifiers a line of Rust calls or names as a path: `name(`, `name::<`, `.name` and
/// `::name`.
fn called(line: &str) -> BTreeSet<&str> {
    let code = code_of(line);
    let bytes = code.as_bytes();
    let word = |b: u8| b.is_ascii_alphanumeric() || b == b'_';
    let mut found = BTreeSet::new();
    let mut at = 0;
    while at < bytes.len() {
        if !word(bytes[at]) || (at > 0 && word(bytes[at - 1])) {
            at += 1;
            continue;
        }
        let end = at + bytes[at..].iter().take_while(|b| word(**b)).count();
        let before = &code[..at];
        let after = code[end..].trim_start();
        if before.ends_with('.')
            || before.ends_with("::")
            || after.starts_with('(')
            || after.starts_with("::<")
        {
            found.insert(&code[at..end]);
        }
        at = end;
    }
    found
}

/// Public functions of the library with no caller in the workspace, kept on purpose for its
/// users; each must be shown to them in README.md or docs/GUIDE.md. Prefer a test that calls
/// a function to an entry here.
const KEPT_FOR_USERS: [&str; 0] = [];

/// Goal: the library carries no dead public functions: every `pub fn` of crates/annals/src is
/// called or tested somewhere in the workspace besides its definition. Method: a textual
/// search of the tracked Rust sources, comments aside, for `name(`, `.name` or `::name` on any
/// line but a definition of that name; a function that has gone is simply not looked for.
#[test]
fn every_public_function_of_the_library_is_used() {
    let sources: Vec<(String, String)> = tracked_text()
        .into_iter()
        .filter(|(path, _)| path.ends_with(".rs"))
        .collect();
    let mut defined: BTreeMap<String, BTreeSet<(String, usize)>> = BTreeMap::new();
    for (path, text) in sources
        .iter()
        .filter(|(p, _)| p.starts_with("crates/annals/src/"))
    {
        for (n, line) in text.lines().enumerate() {
            let Some(mut rest) = line.trim_start().strip_prefix("pub ") else {
                continue;
            };
            for qualifier in ["const ", "async ", "unsafe "] {
                rest = rest.strip_prefix(qualifier).unwrap_or(rest);
            }
            let Some(rest) = rest.strip_prefix("fn ") else {
                continue;
            };
            let name: String = rest
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            defined.entry(name).or_default().insert((path.clone(), n));
        }
    }
    let mut used: BTreeSet<&str> = BTreeSet::new();
    for (path, text) in &sources {
        for (n, line) in text.lines().enumerate() {
            for name in called(line) {
                let definition = defined
                    .get(name)
                    .is_some_and(|at| at.contains(&(path.clone(), n)));
                if !definition {
                    used.insert(name);
                }
            }
        }
    }
    let documented = ["README.md", "docs/GUIDE.md"]
        .map(|doc| std::fs::read_to_string(root().join(doc)).unwrap())
        .concat();
    let mut problems = Vec::new();
    for (name, places) in &defined {
        if KEPT_FOR_USERS.contains(&name.as_str()) {
            if !documented.contains(&format!("{name}(")) {
                problems.push(format!(
                    "{name} is kept for users but neither README.md nor docs/GUIDE.md shows it"
                ));
            }
        } else if !used.contains(name.as_str()) {
            let (path, n) = places.first().unwrap();
            problems.push(format!(
                "{path}:{}: {name} is neither called nor tested",
                n + 1
            ));
        }
    }
    assert!(
        problems.is_empty(),
        "public functions of the library:\n{}",
        problems.join("\n")
    );
}

/// The most lines a test file may have. A test file is where a reader learns what one part of
/// the system promises; past this it holds several topics and is split by topic (as the suite
/// both backends run is apart from the PostgreSQL-only cases), what its parts share going to
/// the crate's `tests/common`.
const TEST_FILE_LINES_MAX: usize = 1000;

/// The Rust files under `dir`, recursively.
fn rust_files(dir: &Path) -> Vec<PathBuf> {
    annals_testkit::walk(dir)
        .into_iter()
        .filter(|path| path.extension().is_some_and(|e| e == "rs"))
        .collect()
}

/// Goal: every test file stays readable as one topic: none passes [`TEST_FILE_LINES_MAX`]
/// lines. Method: every Rust file under a crate's tests/ directory as it is on disk (so that a
/// file not yet committed counts too), the modules the tests share included.
#[test]
fn test_files_are_short() {
    let mut problems = Vec::new();
    let mut seen = 0;
    for krate in std::fs::read_dir(root().join("crates")).unwrap().flatten() {
        for path in rust_files(&krate.path().join("tests")) {
            seen += 1;
            let lines = std::fs::read_to_string(&path).unwrap().lines().count();
            if lines > TEST_FILE_LINES_MAX {
                let relative = path.strip_prefix(root()).unwrap().display().to_string();
                problems.push(format!("{relative} has {lines} lines"));
            }
        }
    }
    assert!(seen > 0, "the test files were found");
    assert!(
        problems.is_empty(),
        "test files over {TEST_FILE_LINES_MAX} lines (split them by topic):\n{}",
        problems.join("\n")
    );
}

/// Tests that do not yet say their goal, by name: to be given their goal. Keep it empty; a
/// name here that has since been given its goal fails the rule until it is taken out.
const GOAL_TO_COME: [&str; 0] = [];

/// The name of the function a line declares (`fn name`), if it declares one.
fn declared_fn(line: &str) -> Option<&str> {
    line.match_indices("fn ").find_map(|(at, _)| {
        let rest = &line[at + "fn ".len()..];
        let end = rest
            .find(|c: char| !(c.is_alphanumeric() || c == '_'))
            .unwrap_or(rest.len());
        (end > 0).then(|| &rest[..end])
    })
}

/// Goal: every test tells its reader what it makes sure of: each `#[test]` in a crate's tests/
/// or src/ has a doc comment with `Goal:` (the behaviour a user or operator relies on), so a
/// failure says what is lost. Method: over the Rust files git tracks under crates/*/tests and
/// crates/*/src, the doc comment and attributes right above each `#[test]` line are searched
/// for `Goal:`; the test's name is the next function declared.
#[test]
fn every_test_says_its_goal() {
    let mut problems = Vec::new();
    let mut seen = 0;
    let mut waiting: BTreeSet<&str> = BTreeSet::new();
    for (path, text) in tracked_text() {
        let parts: Vec<&str> = path.split('/').collect();
        let in_crate = parts.len() > 3
            && parts[0] == "crates"
            && (parts[2] == "tests" || parts[2] == "src")
            && path.ends_with(".rs");
        if !in_crate {
            continue;
        }
        let lines: Vec<&str> = text.lines().collect();
        for (at, line) in lines.iter().enumerate() {
            if line.trim() != "#[test]" {
                continue;
            }
            seen += 1;
            let (n, name) = lines[at + 1..]
                .iter()
                .enumerate()
                .find_map(|(k, l)| declared_fn(l).map(|name| (at + 1 + k, name)))
                .unwrap_or((at, "(no function)"));
            let has_goal = lines[..at]
                .iter()
                .rev()
                .take_while(|l| {
                    let l = l.trim();
                    l.starts_with("///") || l.starts_with("#[")
                })
                .any(|l| l.contains("Goal:"));
            if has_goal {
                continue;
            }
            if let Some(name) = GOAL_TO_COME.iter().find(|allowed| **allowed == name) {
                waiting.insert(*name);
            } else {
                problems.push(format!("{path}:{}: {name}", n + 1));
            }
        }
    }
    for name in GOAL_TO_COME.iter().filter(|name| !waiting.contains(**name)) {
        problems.push(format!(
            "{name} is in GOAL_TO_COME but lacks nothing (take it out)"
        ));
    }
    assert!(seen > 0, "the tests were found");
    assert!(
        problems.is_empty(),
        "tests whose doc comment has no `Goal:` (say what the test makes sure of):\n{}",
        problems.join("\n")
    );
}
