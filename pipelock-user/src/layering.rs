//! The module structure, checked on the sources of every crate:
//! - in pipelock-user, every module a file names must be in a layer it may
//!   depend on (the table below, the data path of `lib.rs`): an import that
//!   points up the data path fails;
//! - in every crate, no two modules may name each other, directly or round
//!   a longer loop, whether the path says `crate::`, `super::` or `self::`.
//!   A module naming its own ancestors (a parent's shared items) is not a
//!   cycle: a parent declares its children.
use std::{
    collections::{BTreeMap, BTreeSet},
    fs,
    path::{Path, PathBuf},
};

/// A module, as the segments of its path below the crate root.
type Module = Vec<String>;

/// Modules any layer may use.
const LEAVES: &[&str] = &["error", "interrupt", "output", "units"];

/// What each top-level module of pipelock-user may name besides itself and
/// the leaves. The model (pipelock-model, re-exported as `crate::model`) is
/// the base vocabulary every layer shares; being a crate of its own, what
/// it may use is the compiler's to check, not this table's.
const ALLOWED: &[(&str, &[&str])] = &[
    ("error", &[]),
    ("interrupt", &[]),
    ("output", &[]),
    ("units", &[]),
    ("kernel", &[]),
    ("bpf", &["kernel"]),
    ("collect", &["bpf", "kernel"]),
    ("render", &[]),
    ("tui", &["render"]),
    ("workload", &[]),
    ("cli", &["bpf", "workload"]),
    (
        "cmd",
        &["bpf", "cli", "collect", "kernel", "render", "tui", "workload"],
    ),
];

/// The code of a source file that the module itself runs: comment lines
/// dropped, and a trailing `#[cfg(test)] mod … { … }` cut off (its
/// `super::` is the file itself, and tests may reach anywhere).
fn code_of(source: &str) -> String {
    let lines: Vec<&str> = source.lines().collect();
    let end = lines
        .windows(2)
        .position(|w| {
            w[0].trim() == "#[cfg(test)]"
                && w[1].trim_start().starts_with("mod ")
                && w[1].trim_end().ends_with('{')
        })
        .unwrap_or(lines.len());
    lines[..end]
        .iter()
        .filter(|l| !l.trim_start().starts_with("//"))
        .copied()
        .collect::<Vec<_>>()
        .join("\n")
}

fn is_ident(c: char) -> bool {
    c.is_alphanumeric() || c == '_'
}

/// The paths of a `use` tree or an inline path that starts at `text`
/// (after its `crate::`/`super::`/`self::`), each as its segments:
/// `a::{b, c::{d, e}}` gives `a::b`, `a::c::d`, `a::c::e`.
fn paths_at(text: &str) -> Vec<Module> {
    fn tree(text: &str, prefix: &Module, out: &mut Vec<Module>) -> usize {
        let mut segments = prefix.clone();
        let mut at = 0;
        loop {
            let rest = &text[at..];
            let trimmed = rest.trim_start();
            at += rest.len() - trimmed.len();
            if let Some(group) = trimmed.strip_prefix('{') {
                at += 1;
                let mut consumed = 0;
                loop {
                    let item = &group[consumed..];
                    let used = tree(item, &segments, out);
                    consumed += used;
                    let after = group[consumed..].trim_start();
                    consumed = group.len() - after.len();
                    if let Some(_next) = after.strip_prefix(',') {
                        consumed += 1;
                        continue;
                    }
                    if after.starts_with('}') {
                        consumed += 1;
                    }
                    break;
                }
                return at + consumed;
            }
            let ident: String = trimmed
                .chars()
                .take_while(|c| is_ident(*c) || *c == '*')
                .collect();
            if ident.is_empty() {
                if segments.len() > prefix.len() {
                    out.push(segments);
                }
                return at;
            }
            at += ident.len();
            segments.push(ident);
            if text[at..].starts_with("::") {
                at += 2;
            } else {
                out.push(segments);
                return at;
            }
        }
    }
    let mut out = Vec::new();
    tree(text, &Vec::new(), &mut out);
    out
}

/// Every path the code names from `crate::`, `super::` or `self::`,
/// resolved against the file's own module to an absolute path.
fn named_paths(code: &str, module: &[String]) -> Vec<Module> {
    let mut found = Vec::new();
    for (at, _) in code.match_indices("::") {
        let before = &code[..at];
        let root: String = before
            .chars()
            .rev()
            .take_while(|c| is_ident(*c))
            .collect::<Vec<_>>()
            .into_iter()
            .rev()
            .collect();
        let preceding = before[..before.len() - root.len()].chars().next_back();
        if preceding.is_some_and(|c| c == ':' || is_ident(c)) {
            continue;
        }
        let mut base: Module = match root.as_str() {
            "crate" => Vec::new(),
            "self" => module.to_vec(),
            "super" => module[..module.len().saturating_sub(1)].to_vec(),
            _ => continue,
        };
        for path in paths_at(&code[at + 2..]) {
            let mut segments = path.as_slice();
            while let Some(rest) = segments.strip_prefix(&["super".to_owned()]) {
                base.pop();
                segments = rest;
            }
            let mut full = base.clone();
            full.extend(segments.iter().filter(|s| *s != "self" && *s != "*").cloned());
            found.push(full);
        }
    }
    found
}

/// A crate's modules, from its `src/` tree, with their source files.
fn modules_of(src: &Path) -> BTreeMap<Module, PathBuf> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        for entry in fs::read_dir(dir).unwrap().map(Result::unwrap) {
            let path = entry.path();
            if path.is_dir() {
                walk(&path, out);
            } else if path.extension().is_some_and(|e| e == "rs") {
                out.push(path);
            }
        }
    }
    let mut files = Vec::new();
    walk(src, &mut files);
    let mut modules = BTreeMap::new();
    for file in files {
        let relative = file.strip_prefix(src).unwrap();
        let mut module: Module = relative
            .iter()
            .map(|s| s.to_string_lossy().trim_end_matches(".rs").to_owned())
            .collect();
        if module
            .last()
            .is_some_and(|m| m == "mod" || m == "lib" || m == "main")
        {
            module.pop();
        }
        // The crate roots (lib.rs, main.rs) are one module: the root.
        if !module.is_empty() || !modules.contains_key(&module) {
            modules.insert(module, file);
        }
    }
    modules
}

/// The module a path lands in: its longest prefix that is a module.
fn module_of(path: &[String], modules: &BTreeMap<Module, PathBuf>) -> Module {
    (0..=path.len())
        .rev()
        .map(|n| path[..n].to_vec())
        .find(|prefix| modules.contains_key(prefix))
        .unwrap_or_default()
}

/// Which modules each module names, ancestors and itself left out.
fn graph(sources: &BTreeMap<Module, String>) -> BTreeMap<Module, BTreeSet<Module>> {
    let modules: BTreeMap<Module, PathBuf> = sources.keys().map(|m| (m.clone(), PathBuf::new())).collect();
    let mut edges = BTreeMap::new();
    for (module, source) in sources {
        let named: BTreeSet<Module> = named_paths(&code_of(source), module)
            .iter()
            .map(|p| module_of(p, &modules))
            .filter(|target| !module.starts_with(target) && !target.starts_with(module))
            .collect();
        edges.insert(module.clone(), named);
    }
    edges
}

/// A loop of modules naming each other, if there is one.
fn find_cycle(edges: &BTreeMap<Module, BTreeSet<Module>>) -> Option<Vec<Module>> {
    fn visit(
        at: &Module,
        edges: &BTreeMap<Module, BTreeSet<Module>>,
        done: &mut BTreeSet<Module>,
        stack: &mut Vec<Module>,
    ) -> Option<Vec<Module>> {
        if let Some(start) = stack.iter().position(|m| m == at) {
            let mut cycle = stack[start..].to_vec();
            cycle.push(at.clone());
            return Some(cycle);
        }
        if !done.insert(at.clone()) {
            return None;
        }
        stack.push(at.clone());
        for next in edges.get(at).into_iter().flatten() {
            if let Some(cycle) = visit(next, edges, done, stack) {
                return Some(cycle);
            }
        }
        stack.pop();
        None
    }
    let mut done = BTreeSet::new();
    edges
        .keys()
        .find_map(|start| visit(start, edges, &mut done, &mut Vec::new()))
}

fn crate_sources(krate: &str) -> BTreeMap<Module, String> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join(krate)
        .join("src");
    modules_of(&src)
        .into_iter()
        .map(|(module, file)| (module, fs::read_to_string(file).unwrap()))
        .collect()
}

fn show(cycle: &[Module]) -> String {
    cycle
        .iter()
        .map(|m| {
            if m.is_empty() {
                "crate".to_owned()
            } else {
                m.join("::")
            }
        })
        .collect::<Vec<_>>()
        .join(" → ")
}

#[test]
fn no_crate_has_a_cycle_between_its_modules() {
    for krate in [
        "pipelock-user",
        "pipelock-ebpf",
        "pipelock-common",
        "pipelock-model",
        "pipelock-vm",
        "xtask",
    ] {
        let sources = crate_sources(krate);
        assert!(
            sources.len() > 2 || krate == "pipelock-common",
            "{krate}: only {} modules read",
            sources.len()
        );
        if let Some(cycle) = find_cycle(&graph(&sources)) {
            panic!("{krate}: modules name each other: {}", show(&cycle));
        }
    }
}

#[test]
fn modules_only_use_the_layers_below_them() {
    let sources = crate_sources("pipelock-user");
    let modules: BTreeMap<Module, PathBuf> = sources.keys().map(|m| (m.clone(), PathBuf::new())).collect();
    let mut checked = 0;
    for (module, source) in &sources {
        let Some(top) = module.first() else { continue };
        // This file's tests quote paths.
        if top == "layering" {
            continue;
        }
        let allowed = ALLOWED
            .iter()
            .find(|(m, _)| m == top)
            .unwrap_or_else(|| panic!("{top}: not in the layering table"))
            .1;
        let code = code_of(source);
        for path in named_paths(&code, module) {
            let Some(named) = module_of(&path, &modules).first().cloned() else {
                continue;
            };
            let ok = named == *top || LEAVES.contains(&named.as_str()) || allowed.contains(&named.as_str());
            assert!(
                ok,
                "{}: names {}, above or beside `{top}`",
                module.join("::"),
                path.join("::")
            );
        }
        checked += 1;
    }
    assert!(checked > 30, "only {checked} files checked");
}

fn module(path: &str) -> Module {
    path.split("::")
        .filter(|s| !s.is_empty())
        .map(str::to_owned)
        .collect()
}

#[test]
fn the_scanner_resolves_crate_super_and_self_paths() {
    let names = named_paths(
        "use crate::{\n    Error,\n    bpf::{self, maps::{a, b}},\n    model::Timing,\n};\nlet x = crate::render::render(r);\nuse super::text::human_ns;\nuse super::super::units::x;\nuse self::child::Y;\nlet y = foo::super_thing::z;",
        &module("render::callers"),
    );
    let want: Vec<Module> = [
        "Error",
        "bpf",
        "bpf::maps::a",
        "bpf::maps::b",
        "model::Timing",
        "render::render",
        "render::text::human_ns",
        "units::x",
        "render::callers::child::Y",
    ]
    .map(module)
    .into();
    assert_eq!(names, want);
}

/// The check fails on a cycle, through `super::` as through `crate::`.
#[test]
fn a_cycle_through_super_is_found() {
    let sources: BTreeMap<Module, String> = [
        ("", "pub mod render;"),
        ("render", "pub mod text;\npub mod callers;"),
        ("render::text", "use super::callers::caller_table;"),
        ("render::callers", "use super::text::human_ns;"),
    ]
    .into_iter()
    .map(|(m, s)| (module(m), s.to_owned()))
    .collect();
    let cycle = find_cycle(&graph(&sources)).expect("the cycle is found");
    assert_eq!(show(&cycle), "render::callers → render::text → render::callers");

    let mut fixed = sources.clone();
    fixed.insert(
        module("render::callers"),
        "use crate::units::human_ns;".to_owned(),
    );
    fixed.insert(module("units"), String::new());
    assert_eq!(find_cycle(&graph(&fixed)), None);

    // A child naming its parent's items, and the parent its children: no cycle.
    let tree: BTreeMap<Module, String> = [("tui", "use self::app::App;"), ("tui::app", "use super::Thing;")]
        .into_iter()
        .map(|(m, s)| (module(m), s.to_owned()))
        .collect();
    assert_eq!(find_cycle(&graph(&tree)), None);
}

#[test]
fn test_modules_are_not_the_modules_code() {
    let code = code_of("use crate::a::b;\n#[cfg(test)]\nmod tests {\n    use crate::tui::x;\n}\n");
    assert_eq!(named_paths(&code, &[]), [module("a::b")]);
}

/// The model crate's own dependencies (and so everything it can reach):
/// no aya (pipelock-common without its `user` feature), clap, tokio or
/// anything else that does I/O. A new one is a decision, made here. What
/// the crate boundary cannot say, that its code does no I/O through std
/// itself, is read from its sources.
#[test]
fn the_model_is_plain_values() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("../pipelock-model/src");
    for (module, source) in modules_of(&src) {
        let code = code_of(&fs::read_to_string(&source).unwrap());
        for io in ["std::fs", "std::io", "std::net", "std::process", "std::env"] {
            assert!(!code.contains(io), "pipelock-model's {module:?} uses {io}");
        }
    }
    const PLAIN: &[&str] = &["glob", "pipelock-common", "serde", "serde_json", "statrs"];
    let manifest =
        fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../pipelock-model/Cargo.toml"))
            .unwrap();
    let mut section = "";
    let mut named = Vec::new();
    for line in manifest.lines().map(str::trim) {
        if line.starts_with('[') {
            section = line;
        } else if section == "[dependencies]"
            && let Some((name, spec)) = line.split_once('=')
        {
            let name = name.trim();
            assert!(PLAIN.contains(&name), "pipelock-model depends on {name}");
            assert!(
                !spec.contains("features"),
                "pipelock-model turns on features of {name}: {spec}"
            );
            named.push(name);
        }
    }
    assert_eq!(
        named.len(),
        PLAIN.len(),
        "the manifest's dependencies were not all read: {named:?}"
    );
}
