//! Keeps the code's shape mechanically: no crate's modules import each other in a circle of
//! more than two files, so that each crate reads as layers from its root down. (The documents'
//! checks are tidy.rs.) It collects every circle before it fails, so one run lists them all.
mod common;

use std::collections::{BTreeMap, BTreeSet};

use common::{code_of, tracked_text};

/// Each crate's source files (relative to its src/, binaries under src/bin/ aside) and, for
/// each, the files it names through `crate::`, `super::` and `self::` paths, and a crate root
/// also through paths that start at one of its modules (`http::router`). A path resolves to
/// the deepest module file it names (`crate::store::submit::Append` to `store/submit.rs`). A
/// crate root counts like any file but for its `mod` declarations and its re-exports
/// (`pub use`, `pub(crate) use`), which name nothing: a path to a name the root re-exports
/// (`crate::Store`) names the file the name comes from, and only a path to an item the root
/// defines itself names the root. So a root that declares modules and re-exports their items
/// is in no circle, while one that defines what its modules import, and uses those modules,
/// is. A parent's paths to its own children (`child::x`) outside the root are how Rust
/// declares them and are not counted. Comments and the test module at a file's end aside.
fn module_graphs() -> BTreeMap<String, BTreeMap<String, BTreeSet<String>>> {
    let mut graphs = BTreeMap::new();
    let mut by_crate: BTreeMap<String, Vec<(String, String)>> = BTreeMap::new();
    for (path, text) in tracked_text() {
        let Some((krate, relative)) = path.split_once("/src/") else {
            continue;
        };
        if krate.starts_with("crates/") && path.ends_with(".rs") && !relative.starts_with("bin/") {
            let code = text
                .split("#[cfg(test)]\nmod tests")
                .next()
                .unwrap()
                .lines()
                .map(code_of)
                .collect::<Vec<_>>()
                .join("\n");
            by_crate
                .entry(krate.to_string())
                .or_default()
                .push((relative.to_string(), code));
        }
    }
    for (krate, files) in by_crate {
        // Each file's module path: a directory's `mod.rs` is the directory's module.
        let module_of = |relative: &str| -> Vec<String> {
            let mut parts: Vec<String> = relative
                .trim_end_matches(".rs")
                .split('/')
                .map(str::to_string)
                .collect();
            if parts.last().is_some_and(|p| p == "mod") || parts == ["lib"] || parts == ["main"] {
                parts.pop();
            }
            parts
        };
        let files_by_module: BTreeMap<Vec<String>, String> = files
            .iter()
            .map(|(relative, _)| (module_of(relative), relative.clone()))
            .collect();
        let code_by_file: BTreeMap<&String, &String> = files
            .iter()
            .map(|(relative, code)| (relative, code))
            .collect();
        let root = files_by_module.get(&Vec::new());
        let root_code = root.map_or("", |file| code_by_file[file].as_str());
        let reexported: Vec<(Vec<String>, String)> = reexports(root_code)
            .into_iter()
            .flat_map(|(_, tree)| use_tree_paths(tree))
            .collect();
        let is_module = |name: &String| files_by_module.contains_key(std::slice::from_ref(name));
        let deepest = |path: &[String]| -> Option<String> {
            (0..=path.len())
                .take_while(|n| files_by_module.contains_key(&path[..*n]))
                .last()
                .map(|n| files_by_module[&path[..n]].clone())
        };
        let resolve = |path: &[String]| -> Option<String> {
            // A glob of the root's names (`super::*` in a top-level module) names the root.
            let Some(first) = path.first() else {
                return root.cloned();
            };
            if is_module(first) {
                return deepest(path);
            }
            // A name the root re-exports names the file it comes from; one from another crate
            // names none.
            if let Some((source, _)) = reexported.iter().find(|(_, name)| name == first) {
                let full: Vec<String> = source.iter().chain(&path[1..]).cloned().collect();
                return full.first().filter(|m| is_module(m)).and(deepest(&full));
            }
            if defines(root_code, first) {
                return root.cloned();
            }
            // What a glob re-export (`pub use types::*`) brings: the file of its module that
            // defines the name.
            reexported
                .iter()
                .filter(|(source, name)| name == "*" && source.first().is_some_and(is_module))
                .filter_map(|(source, _)| deepest(source))
                .find(|file| defines(code_by_file[file], first))
        };
        let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        for (relative, code) in &files {
            let module = module_of(relative);
            // The root's re-exports are blanked out, so that positions stay as they were.
            let mut code = code.clone();
            if module.is_empty() {
                for (span, _) in reexports(root_code) {
                    code.replace_range(span.clone(), &" ".repeat(span.len()));
                }
            }
            let word = |c: char| c.is_ascii_alphanumeric() || c == '_';
            let starts_path = |at: usize| !code[..at].ends_with(|c: char| word(c) || c == ':');
            // Where each path starts, the module it is relative to, and where its rest begins.
            let mut starts: Vec<(usize, Vec<String>, usize)> = Vec::new();
            for (at, _) in code.match_indices("crate::") {
                starts.push((at, Vec::new(), at + "crate::".len()));
            }
            for (at, _) in code.match_indices("self::") {
                starts.push((at, module.clone(), at + "self::".len()));
            }
            for (at, _) in code.match_indices("super::") {
                let parent = module[..module.len().saturating_sub(1)].to_vec();
                starts.push((at, parent, at + "super::".len()));
            }
            if module.is_empty() {
                for child in files_by_module.keys().filter(|m| m.len() == 1) {
                    for (at, _) in code.match_indices(&format!("{}::", child[0])) {
                        starts.push((at, Vec::new(), at));
                    }
                }
            }
            let named = graph.entry(relative.clone()).or_default();
            for (at, mut base, rest_at) in starts {
                // A path starts where no word or other path ends: `super::super::` is found once,
                // at its first `super`, and `annals::io::` in a root is not the root's own `io`.
                if !starts_path(at) {
                    continue;
                }
                let mut rest = &code[rest_at..];
                while let Some(after) = rest.strip_prefix("super::") {
                    base.pop();
                    rest = after;
                }
                // `a::b::{c, d::e}`: the prefix, then each path of its group.
                let prefix_len = rest
                    .find(|c: char| !(word(c) || c == ':'))
                    .unwrap_or(rest.len());
                let (prefix, after) = rest.split_at(prefix_len);
                let paths: Vec<String> = match after.strip_prefix('{') {
                    Some(group) => group[..group.find('}').unwrap_or(group.len())]
                        .split(',')
                        .map(|item| format!("{prefix}{}", item.trim()))
                        .collect(),
                    None => vec![prefix.to_string()],
                };
                for path in paths {
                    let segments: Vec<String> = path
                        .split("::")
                        .map(|s| s.chars().take_while(|c| word(*c)).collect::<String>())
                        .take_while(|s| !s.is_empty())
                        .collect();
                    let full: Vec<String> = base.iter().cloned().chain(segments).collect();
                    if let Some(file) = resolve(&full).filter(|f| f != relative) {
                        named.insert(file);
                    }
                }
            }
        }
        graphs.insert(krate, graph);
    }
    graphs
}

/// The re-exports of a file's code (`pub use a::{b, c};`, `pub(crate) use d::e as f;`): each
/// statement's span and its use tree.
fn reexports(code: &str) -> Vec<(std::ops::Range<usize>, &str)> {
    let mut found = Vec::new();
    for (at, _) in code.match_indices("use ") {
        let line_start = code[..at].rfind('\n').map_or(0, |n| n + 1);
        let visibility = code[line_start..at].trim();
        let public =
            visibility == "pub" || (visibility.starts_with("pub(") && visibility.ends_with(')'));
        let Some(end) = code[at..].find(';').map(|n| at + n) else {
            continue;
        };
        if public {
            found.push((line_start..end + 1, &code[at + "use ".len()..end]));
        }
    }
    found
}

/// The paths of a use tree (`a::{b, c::d as e, f::*}`), each with the name it makes visible
/// (a glob's name is `*`); a leading `crate` or `self` is dropped, as in the root they add
/// nothing.
fn use_tree_paths(tree: &str) -> Vec<(Vec<String>, String)> {
    let tree = tree.trim();
    let segments = |text: &str| -> Vec<String> {
        text.split("::")
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(str::to_string)
            .collect()
    };
    let mut paths = Vec::new();
    match tree.find('{') {
        Some(open) => {
            let prefix = segments(&tree[..open]);
            let group = &tree[open + 1..tree.rfind('}').unwrap_or(tree.len())];
            // The group's items, split at its own commas, not at those of a nested group.
            let (mut depth, mut from) = (0, 0);
            let mut items = Vec::new();
            for (at, c) in group.char_indices() {
                match c {
                    '{' => depth += 1,
                    '}' => depth -= 1,
                    ',' if depth == 0 => {
                        items.push(&group[from..at]);
                        from = at + 1;
                    }
                    _ => {}
                }
            }
            items.push(&group[from..]);
            for item in items.into_iter().filter(|item| !item.trim().is_empty()) {
                for (path, name) in use_tree_paths(item) {
                    paths.push((prefix.iter().cloned().chain(path).collect(), name));
                }
            }
        }
        None => {
            let (path, alias) = match tree.split_once(" as ") {
                Some((path, alias)) => (path, Some(alias.trim().to_string())),
                None => (tree, None),
            };
            let mut path = segments(path);
            if path.last().is_some_and(|s| s == "self") {
                path.pop();
            }
            if let Some(name) = alias.or_else(|| path.last().cloned()) {
                paths.push((path, name));
            }
        }
    }
    for (path, _) in &mut paths {
        if path.first().is_some_and(|s| s == "crate" || s == "self") {
            path.remove(0);
        }
    }
    paths
}

/// Whether a file's code defines an item of this name (pragmatic: at any depth, so a method
/// of the name counts too).
fn defines(code: &str, name: &str) -> bool {
    let word = |c: char| c.is_ascii_alphanumeric() || c == '_';
    let kinds = "fn struct enum union trait type const static mod macro_rules!".split(' ');
    kinds.into_iter().any(|kind| {
        let definition = format!("{kind} {name}");
        code.match_indices(&definition).any(|(at, _)| {
            !code[..at].ends_with(word) && !code[at + definition.len()..].starts_with(word)
        })
    })
}

/// The import circles of a graph of more than two files: each file with the files it reaches
/// that reach it back.
fn circles(graph: &BTreeMap<String, BTreeSet<String>>) -> BTreeSet<BTreeSet<String>> {
    let reach = |from: &String| -> BTreeSet<String> {
        let mut seen = BTreeSet::new();
        let mut todo = vec![from.clone()];
        while let Some(file) = todo.pop() {
            for next in graph.get(&file).into_iter().flatten() {
                if seen.insert(next.clone()) {
                    todo.push(next.clone());
                }
            }
        }
        seen
    };
    let reached: BTreeMap<&String, BTreeSet<String>> =
        graph.keys().map(|file| (file, reach(file))).collect();
    reached
        .iter()
        .map(|(file, from_it)| {
            from_it
                .iter()
                .filter(|other| reached.get(other).is_some_and(|back| back.contains(*file)))
                .cloned()
                .chain([(*file).clone()])
                .collect::<BTreeSet<String>>()
        })
        .filter(|circle| circle.len() > 2)
        .collect()
}

/// Goal: no crate's modules import each other in a circle of more than two files, so that each
/// crate reads as layers from its root down, the root (`lib.rs`, `main.rs`) included. Method:
/// each crate's graph of paths between its source files (`module_graphs`: the root counts like
/// any file but for its `mod` declarations and re-exports), and the files that reach each other
/// in it.
#[test]
fn no_import_circle_joins_more_than_two_files() {
    let graphs = module_graphs();
    let storage = &graphs["crates/annals"];
    assert!(
        storage["append.rs"].contains("store/mod.rs"),
        "the storage crate's graph was read: the append builder names the store"
    );
    let server = &graphs["crates/annals-server"];
    assert!(
        server["lib.rs"].contains("http.rs") && server["http.rs"].contains("state.rs"),
        "crate roots were read: the server's root names the HTTP module (`http::router`), and \
         the HTTP module's `crate::AppState`, a re-export, names the file that defines it"
    );
    let mut problems = Vec::new();
    for (krate, graph) in graphs {
        for circle in circles(&graph) {
            problems.push(format!("{krate}/src: {circle:?} import each other"));
        }
    }
    assert!(
        problems.is_empty(),
        "import circles (move what they share into a module below them):\n{}",
        problems.join("\n")
    );
}
