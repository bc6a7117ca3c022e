//! The one configuration both kernels of a `pipelock ab --source` build:
//! the tree's `make tinyconfig`, pipelock's fragment (what its guests and
//! programs need) and the user's, merged by the kernel's own
//! `scripts/kconfig/merge_config.sh`, then checked: an option a fragment
//! asks for that the merged configuration does not have is an error
//! naming it, not a kernel that boots and cannot be traced.
use std::collections::BTreeMap;

/// pipelock's fragment, shipped in the binary.
pub const FRAGMENT: &str = include_str!("../../kernel.config");

/// A fragment's or a `.config`'s assignments: `CONFIG_X=value`, and
/// `# CONFIG_X is not set` as `n`.
pub fn assignments(text: &str) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    for line in text.lines().map(str::trim) {
        if let Some(name) = line
            .strip_prefix("# ")
            .and_then(|l| l.strip_suffix(" is not set"))
            .filter(|n| n.starts_with("CONFIG_"))
        {
            out.insert(name.to_owned(), "n".to_owned());
        } else if line.starts_with("CONFIG_")
            && let Some((name, value)) = line.split_once('=')
        {
            out.insert(name.to_owned(), value.to_owned());
        }
    }
    out
}

/// One option a fragment asked for and the merged configuration lacks.
#[derive(Debug, PartialEq, Eq)]
pub struct Unsatisfied {
    pub option: String,
    pub wanted: String,
    /// What the merged configuration has: a value, `n`, or None when the
    /// tree has no such option at all.
    pub got: Option<String>,
}

impl std::fmt::Display for Unsatisfied {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.got {
            None => write!(f, "{}={}: this tree has no such option", self.option, self.wanted),
            Some(n) if n == "n" => write!(
                f,
                "{}={} ended up off (an option it depends on is off, or it is not for this architecture)",
                self.option, self.wanted
            ),
            Some(got) => write!(f, "{}={} ended up {got}", self.option, self.wanted),
        }
    }
}

/// What `fragment` asks for and `merged` does not have. An option that a
/// fragment turns off counts as satisfied when it is absent.
pub fn unsatisfied(fragment: &str, merged: &str) -> Vec<Unsatisfied> {
    let merged = assignments(merged);
    assignments(fragment)
        .into_iter()
        .filter_map(|(option, wanted)| {
            let got = merged.get(&option).cloned();
            let ok = match got.as_deref() {
                Some(g) => g == wanted,
                None => wanted == "n",
            };
            (!ok).then_some(Unsatisfied { option, wanted, got })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_option_that_ended_up_off_is_named() {
        let merged = "CONFIG_BPF_SYSCALL=y\n# CONFIG_BPF_JIT is not set\nCONFIG_HZ=250\n";
        let fragment = "# why\nCONFIG_BPF_SYSCALL=y\nCONFIG_BPF_JIT=y\nCONFIG_HZ=1000\nCONFIG_NOPE=y\n# CONFIG_GONE is not set\n";
        let missing = unsatisfied(fragment, merged);
        let text: Vec<String> = missing.iter().map(ToString::to_string).collect();
        assert_eq!(text.len(), 3, "{text:?}");
        assert!(text[0].starts_with("CONFIG_BPF_JIT=y ended up off"), "{text:?}");
        assert_eq!(text[1], "CONFIG_HZ=1000 ended up 250");
        assert_eq!(text[2], "CONFIG_NOPE=y: this tree has no such option");
    }

    #[test]
    fn pipelocks_fragment_asks_for_what_its_programs_need() {
        let wanted = assignments(FRAGMENT);
        for option in [
            "CONFIG_BPF_SYSCALL",
            "CONFIG_DEBUG_INFO_BTF",
            "CONFIG_FUNCTION_TRACER",
            "CONFIG_KPROBES",
            "CONFIG_BLK_DEV_INITRD",
            "CONFIG_SERIAL_8250_CONSOLE",
        ] {
            assert_eq!(wanted.get(option).map(String::as_str), Some("y"), "{option}");
        }
    }
}
