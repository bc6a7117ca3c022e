//! The README and docs against this xtask: the two set-up commands, every documented `cargo xtask` command.
use clap::Parser as _;

use super::*;

/// The README's set-up block: exactly the main job and the tests, each
/// a command this xtask takes.
#[test]
fn the_readme_opens_with_the_two_commands_this_xtask_runs() {
    let readme = std::fs::read_to_string(workspace_root().join("README.md")).unwrap();
    let block = readme
        .split("```sh\n")
        .nth(1)
        .and_then(|rest| rest.split("```").next())
        .expect("README.md has a ```sh block");
    let commands: Vec<&str> = block
        .lines()
        .map(|l| l.split('#').next().unwrap().trim())
        .filter(|l| !l.is_empty())
        .collect();
    assert_eq!(commands, ["cargo xtask run", "cargo xtask test"]);
    for command in commands {
        let words = std::iter::once("xtask").chain(command.split_whitespace().skip(2));
        assert!(
            matches!(
                Cli::try_parse_from(words).map(|c| c.command),
                Ok(Task::Run { .. } | Task::Test { .. })
            ),
            "{command}"
        );
    }
}

/// Every `cargo xtask …` the manual shows parses.
#[test]
fn every_documented_xtask_command_parses() {
    let root = workspace_root();
    let mut pages = vec![root.join("README.md")];
    pages.extend(
        std::fs::read_dir(root.join("docs"))
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p.extension().is_some_and(|e| e == "md")),
    );
    let mut checked = 0;
    for page in pages {
        let text = std::fs::read_to_string(&page).unwrap();
        for piece in text.split('`') {
            // A fenced block's lines, or an inline span wrapped over lines.
            let lines: Vec<String> = if piece.starts_with("sh\n") || piece.starts_with('\n') {
                piece.lines().map(str::to_owned).collect()
            } else {
                vec![piece.replace('\n', " ")]
            };
            for line in lines.iter().map(|l| l.trim().trim_start_matches("$ ")) {
                if !line.starts_with("cargo xtask ") || line.contains(" / ") {
                    continue;
                }
                let line = line.split('#').next().unwrap();
                // `[--pairs 5]`-style synopses: the options inside brackets.
                let words: Vec<String> = line
                    .split_whitespace()
                    .skip(2)
                    .map(|w| w.trim_matches(['[', ']']).to_owned())
                    .take_while(|w| w != "--")
                    .filter(|w| !w.is_empty() && w != "…" && w != "ARGS")
                    .collect();
                if words.first().is_none_or(|w| w.starts_with('-')) {
                    continue;
                }
                checked += 1;
                if line.contains('[') || line.contains('…') {
                    // A synopsis: its options must be the subcommand's.
                    let cli = <Cli as clap::CommandFactory>::command();
                    let sub = cli
                        .find_subcommand(&words[0])
                        .unwrap_or_else(|| panic!("{}: `{line}`: no such task", page.display()));
                    for option in words.iter().filter_map(|w| w.strip_prefix("--")) {
                        assert!(
                            sub.get_arguments().any(|a| a.get_long() == Some(option)),
                            "{}: `{line}`: no option --{option}",
                            page.display()
                        );
                    }
                    continue;
                }
                let argv = std::iter::once("xtask".to_owned()).chain(words.iter().cloned());
                if let Err(err) = Cli::try_parse_from(argv) {
                    panic!(
                        "{}: `{line}`: {}",
                        page.display(),
                        err.to_string().lines().next().unwrap_or("")
                    );
                }
            }
        }
    }
    assert!(checked >= 5, "only {checked} xtask commands found");
}
