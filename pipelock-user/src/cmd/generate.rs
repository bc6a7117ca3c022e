//! `pipelock generate`: man pages and shell completions made from the clap
//! definitions themselves, so the packaged manual cannot drift from the
//! options the binary takes.
use std::path::Path;

use clap::CommandFactory as _;
use clap_complete::Shell;

use crate::{
    Error,
    cli::{Cli, Generated},
};

/// The completion scripts, named as each shell's packaged location expects.
pub const COMPLETIONS: [(Shell, &str); 3] = [
    (Shell::Bash, "pipelock"),
    (Shell::Zsh, "_pipelock"),
    (Shell::Fish, "pipelock.fish"),
];

pub fn run(what: &Generated) -> Result<(), Error> {
    match what {
        Generated::Man { dir } => man_pages(dir),
        Generated::Completions { dir } => completions(dir),
    }
}

/// One page per visible command: `pipelock(1)`, `pipelock-trace(1)`, …
fn man_pages(dir: &Path) -> Result<(), Error> {
    create_dir(dir)?;
    clap_mangen::generate_to(Cli::command(), dir).map_err(|source| Error::Output {
        path: dir.to_owned(),
        source,
    })
}

fn completions(dir: &Path) -> Result<(), Error> {
    create_dir(dir)?;
    for (shell, name) in COMPLETIONS {
        let path = dir.join(name);
        let mut file = std::fs::File::create(&path).map_err(|source| Error::Output {
            path: path.clone(),
            source,
        })?;
        clap_complete::generate(shell, &mut Cli::command(), "pipelock", &mut file);
    }
    Ok(())
}

fn create_dir(dir: &Path) -> Result<(), Error> {
    std::fs::create_dir_all(dir).map_err(|source| Error::Output {
        path: dir.to_owned(),
        source,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_visible_command_gets_a_man_page_and_hidden_ones_none() {
        let dir = std::env::temp_dir().join(format!("pipelock-man-{}", std::process::id()));
        man_pages(&dir).unwrap();
        let mut pages: Vec<String> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        pages.sort();
        for page in [
            "pipelock.1",
            "pipelock-trace.1",
            "pipelock-top.1",
            "pipelock-serve.1",
            "pipelock-run-pipe-herd.1",
        ] {
            assert!(pages.iter().any(|p| p == page), "{page} missing from {pages:?}");
        }
        assert!(
            !pages
                .iter()
                .any(|p| p.contains("ab-emit") || p.contains("generate")),
            "{pages:?}"
        );
        let trace = std::fs::read_to_string(dir.join("pipelock-trace.1")).unwrap();
        assert!(trace.contains("max\\-locks"), "the options are in the page");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn completions_name_the_subcommands() {
        let dir = std::env::temp_dir().join(format!("pipelock-completions-{}", std::process::id()));
        completions(&dir).unwrap();
        for (_, name) in COMPLETIONS {
            let script = std::fs::read_to_string(dir.join(name)).unwrap();
            assert!(script.contains("trace") && script.contains("serve"), "{name}");
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
