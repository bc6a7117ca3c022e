//! The module layering of `lib.rs`, checked on the sources: every
//! `crate::MODULE` path a module names must be one it may depend on, so an
//! import that points up the data path (or a cycle) fails here.
use std::{collections::BTreeSet, fs, path::Path};

/// Modules any layer may use.
const LEAVES: &[&str] = &["error", "interrupt", "output", "units"];

/// What each top-level module may name besides itself and the leaves.
const ALLOWED: &[(&str, &[&str])] = &[
    ("error", &[]),
    ("interrupt", &[]),
    ("output", &[]),
    ("units", &[]),
    ("model", &[]),
    ("kernel", &[]),
    ("bpf", &["kernel", "model"]),
    ("collect", &["bpf", "kernel", "model"]),
    ("render", &["model"]),
    ("tui", &["model", "render"]),
    ("workload", &[]),
    ("cli", &["bpf", "model", "workload"]),
    (
        "cmd",
        &[
            "bpf", "cli", "collect", "kernel", "model", "render", "tui", "workload",
        ],
    ),
];

/// `crate::NAME` paths in code (comment lines skipped), including every
/// top-level name of a `use crate::{…}` group, however it is spread over lines.
fn named_modules(source: &str) -> BTreeSet<String> {
    let code: String = source
        .lines()
        .filter(|l| !l.trim_start().starts_with("//"))
        .collect::<Vec<_>>()
        .join("\n");
    let ident = |text: &str| -> String {
        text.trim_start()
            .chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_')
            .collect()
    };
    let mut names = BTreeSet::new();
    let mut rest = code.as_str();
    while let Some(at) = rest.find("crate::") {
        rest = &rest[at + "crate::".len()..];
        let Some(group) = rest.strip_prefix('{') else {
            names.insert(ident(rest));
            continue;
        };
        // Top-level items of the group: after its `{` and each comma at depth 0.
        let mut depth = 0;
        let mut item_start = true;
        for (i, c) in group.char_indices() {
            if item_start && depth == 0 {
                let name = ident(&group[i..]);
                if !name.is_empty() {
                    names.insert(name);
                    item_start = false;
                }
            }
            match c {
                '{' => depth += 1,
                '}' if depth == 0 => break,
                '}' => depth -= 1,
                ',' if depth == 0 => item_start = true,
                _ => {}
            }
        }
    }
    names.remove("");
    names
}

fn sources(dir: &Path, out: &mut Vec<std::path::PathBuf>) {
    for entry in fs::read_dir(dir).unwrap().map(Result::unwrap) {
        let path = entry.path();
        if path.is_dir() {
            sources(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

#[test]
fn modules_only_use_the_layers_below_them() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    sources(&root, &mut files);
    let mut checked = 0;
    for file in files {
        let relative = file.strip_prefix(&root).unwrap();
        let top = relative.iter().next().unwrap().to_string_lossy();
        let top = top.trim_end_matches(".rs");
        // lib and main wire everything; this file's tests quote paths.
        if top == "lib" || top == "main" || top == "layering" {
            continue;
        }
        let allowed = ALLOWED
            .iter()
            .find(|(m, _)| *m == top)
            .unwrap_or_else(|| panic!("{top}: not in the layering table"))
            .1;
        let source = fs::read_to_string(&file).unwrap();
        for name in named_modules(&source) {
            // `crate::Error` is the re-exported error type.
            let ok = name == top
                || name == "Error"
                || LEAVES.contains(&name.as_str())
                || allowed.contains(&name.as_str());
            assert!(
                ok,
                "{}: names crate::{name}, above or beside `{top}`",
                relative.display()
            );
        }
        if top == "model" {
            for forbidden in ["aya", "clap", "std::fs", "std::io"] {
                assert!(
                    !source
                        .lines()
                        .any(|l| l.starts_with("use ") && l.contains(forbidden)),
                    "{}: the model uses {forbidden}",
                    relative.display()
                );
            }
        }
        checked += 1;
    }
    assert!(checked > 40, "only {checked} files checked");
}

#[test]
fn the_scanner_sees_grouped_and_nested_paths() {
    let names = named_modules(
        "use crate::{\n    Error,\n    bpf::{self, maps::{a, b}},\n    model::Timing,\n};\n// crate::tui in a comment\nlet x = crate::render::render(r);",
    );
    let want: BTreeSet<String> = ["Error", "bpf", "model", "render"].map(str::to_owned).into();
    assert_eq!(
        names, want,
        "nested names (self, maps, a, b) are not modules of the crate"
    );
    let one_line = named_modules("use crate::{Error, bpf::{self, maps}, model::Timing};");
    assert_eq!(one_line, ["Error", "bpf", "model"].map(str::to_owned).into());
}
