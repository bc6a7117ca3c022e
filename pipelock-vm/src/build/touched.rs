//! The functions a patch changes, found in the tree it applies to: each
//! hunk's changed lines, placed in the function whose body holds them.
//! Kernel style makes the bodies easy to find: a function's `{` and `}`
//! stand alone at the start of a line, and its name is the identifier
//! before the first `(` of the lines above the `{`.

/// A function whose body the patch changes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Touched {
    /// The file, as the patch names it (`fs/pipe.c`).
    pub file: String,
    pub function: String,
    /// Declared `inline`: the compiler copies its body into its callers,
    /// so it has no symbol of its own to count calls of.
    pub inline: bool,
    /// `static`: only this file calls it (a static function with one caller
    /// is usually inlined too).
    pub is_static: bool,
    /// The functions of the same file whose bodies call it: where its
    /// body runs if the compiler inlined it.
    pub callers: Vec<String>,
    /// Added by the patch: the tree before it has no such function.
    pub added: bool,
}

/// A function body in a source file: lines `start..=end` (1-based), from
/// its signature's first line to its closing `}`.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Span {
    name: String,
    start: usize,
    body: usize,
    end: usize,
    inline: bool,
    is_static: bool,
}

/// The function bodies of `source`, kernel style.
fn spans(source: &str) -> Vec<Span> {
    let lines: Vec<&str> = source.lines().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < lines.len() {
        if lines[i].trim_end() != "{" {
            i += 1;
            continue;
        }
        let body = i;
        // The signature: the lines above, back to a blank line or the end
        // of something else (a `;`, a `}`, a comment, a directive).
        let mut start = body;
        while start > 0 {
            let above = lines[start - 1].trim_end();
            if above.is_empty()
                || above.trim_start().starts_with("//")
                || above.ends_with(';')
                || above.ends_with('}')
                || above.ends_with("*/")
                || above.starts_with('#')
            {
                break;
            }
            start -= 1;
        }
        let end = (body + 1..lines.len())
            .find(|&j| lines[j].starts_with('}'))
            .unwrap_or(lines.len() - 1);
        let signature = lines[start..body].join(" ");
        if let Some(name) = name_of(&signature) {
            let words: Vec<&str> = signature
                .split(|c: char| !c.is_alphanumeric() && c != '_')
                .collect();
            out.push(Span {
                name,
                start: start + 1,
                body: body + 1,
                end: end + 1,
                inline: words.iter().any(|w| *w == "inline" || *w == "__always_inline"),
                is_static: words.contains(&"static"),
            });
        }
        i = end + 1;
    }
    out
}

/// The function's name in its signature: the identifier before the first
/// `(`; for `SYSCALL_DEFINEn(name, …)`, the system call's.
fn name_of(signature: &str) -> Option<String> {
    let (before, after) = signature.split_once('(')?;
    let name = before
        .rsplit(|c: char| !c.is_alphanumeric() && c != '_')
        .next()
        .filter(|n| !n.is_empty())?;
    if name.starts_with("SYSCALL_DEFINE") || name.starts_with("COMPAT_SYSCALL_DEFINE") {
        let call = after.split([',', ')']).next()?.trim();
        return Some(format!("{name}({call})"));
    }
    // `struct x y = {` and the like are not functions.
    (!signature.contains('=')).then(|| name.to_owned())
}

/// One file's hunks: for each, where it applies in the file before the
/// patch (1-based), the lines it has there (context and removed), and its
/// changed lines as offsets into those, with the added text.
#[derive(Debug, Default)]
struct FilePatch {
    path: String,
    hunks: Vec<Hunk>,
}

#[derive(Debug, Default)]
struct Hunk {
    old_start: usize,
    /// The hunk's lines of the old file (context and removed).
    old: Vec<String>,
    /// Offsets into `old` where a line is removed or lines are added
    /// before it (`old.len()`: at the end).
    changed_at: Vec<usize>,
    /// The added lines.
    added: Vec<String>,
}

/// The files and hunks of a unified diff (`git diff`, `diff -u`). A hunk
/// ends when its header's counts of old and new lines are used up.
fn parse(patch: &str) -> Vec<FilePatch> {
    let mut files: Vec<FilePatch> = Vec::new();
    // Old and new lines the current hunk still has.
    let mut left = (0usize, 0usize);
    for line in patch.lines() {
        // A header where its hunk should have gone on: counts that lied.
        if line.starts_with("@@ -") {
            left = (0, 0);
        }
        if left == (0, 0) {
            if let Some(path) = line.strip_prefix("+++ ") {
                let path = path.split('\t').next().unwrap_or(path).trim();
                let path = path.strip_prefix("b/").unwrap_or(path);
                files.push(FilePatch {
                    path: path.to_owned(),
                    hunks: Vec::new(),
                });
            } else if let (Some(header), Some(file)) = (line.strip_prefix("@@ -"), files.last_mut()) {
                // `-START[,COUNT] +START[,COUNT] @@`; a count left out is 1.
                let range = |r: &str| -> (usize, usize) {
                    let mut parts = r.splitn(2, ',').map(|n| n.parse().unwrap_or(1));
                    (parts.next().unwrap_or(1), parts.next().unwrap_or(1))
                };
                let mut words = header.split_whitespace();
                let (old_start, old_count) = range(words.next().unwrap_or("1"));
                let (_, new_count) = range(words.next().unwrap_or("+1").trim_start_matches('+'));
                file.hunks.push(Hunk {
                    old_start,
                    ..Hunk::default()
                });
                left = (old_count, new_count);
            }
            continue;
        }
        let Some(hunk) = files.last_mut().and_then(|f| f.hunks.last_mut()) else {
            left = (0, 0);
            continue;
        };
        match line.chars().next() {
            Some(' ') | None => {
                hunk.old.push(line.get(1..).unwrap_or("").to_owned());
                left = (left.0.saturating_sub(1), left.1.saturating_sub(1));
            }
            Some('-') => {
                hunk.changed_at.push(hunk.old.len());
                hunk.old.push(line[1..].to_owned());
                left.0 = left.0.saturating_sub(1);
            }
            Some('+') => {
                hunk.changed_at.push(hunk.old.len());
                hunk.added.push(line[1..].to_owned());
                left.1 = left.1.saturating_sub(1);
            }
            // `\ No newline at end of file`
            Some('\\') => {}
            _ => left = (0, 0),
        }
    }
    files
}

/// Where `hunk` applies in `lines` (0-based): at its header's line if its
/// old lines are there, else at the nearest place they are (a patch that
/// applies with an offset).
fn place(hunk: &Hunk, lines: &[&str]) -> Option<usize> {
    let fits = |at: usize| {
        at + hunk.old.len() <= lines.len()
            && hunk
                .old
                .iter()
                .zip(&lines[at..])
                .all(|(want, have)| want.trim_end() == have.trim_end())
    };
    let stated = hunk.old_start.saturating_sub(1);
    (0..lines.len())
        .flat_map(|d| [stated.checked_sub(d), Some(stated + d)])
        .flatten()
        .find(|&at| fits(at))
}

/// The functions `patch` changes, each once, in the order the patch
/// reaches them. `source` gives a file of the tree the patch applies to,
/// by the path the patch names; files it cannot give (new, removed, not C)
/// are passed over. Err names a hunk that is not in its file.
pub fn touched(patch: &str, source: impl Fn(&str) -> Option<String>) -> Result<Vec<Touched>, String> {
    let mut out: Vec<Touched> = Vec::new();
    for file in parse(patch) {
        if !(file.path.ends_with(".c") || file.path.ends_with(".h")) {
            continue;
        }
        let Some(text) = source(&file.path) else {
            continue;
        };
        let lines: Vec<&str> = text.lines().collect();
        let spans = spans(&text);
        let mut names: Vec<(String, bool)> = Vec::new();
        for (n, hunk) in file.hunks.iter().enumerate() {
            let at = place(hunk, &lines)
                .ok_or_else(|| format!("{}: hunk #{} is not in the file", file.path, n + 1))?;
            for &offset in &hunk.changed_at {
                // 1-based line of the change (an addition at the end of the
                // hunk belongs to the line before it).
                let line = at + offset.min(hunk.old.len().saturating_sub(1)) + 1;
                if let Some(span) = spans.iter().find(|s| s.body < line && line <= s.end) {
                    names.push((span.name.clone(), false));
                }
            }
            // Functions the patch adds whole.
            for span in self::spans(&hunk.added.join("\n")) {
                names.push((span.name, true));
            }
        }
        for (name, added) in names {
            if out.iter().any(|t| t.file == file.path && t.function == name) {
                continue;
            }
            let span = spans.iter().find(|s| s.name == name);
            let callers = span.map_or_else(Vec::new, |_| callers_of(&name, &spans, &lines));
            out.push(Touched {
                file: file.path.clone(),
                function: name,
                inline: span.is_some_and(|s| s.inline),
                is_static: span.is_some_and(|s| s.is_static),
                callers,
                added,
            });
        }
    }
    Ok(out)
}

/// The functions the change of `request` makes to its tree: the patch's,
/// read against the tree; or the diff of two revs, read against the first.
pub fn of_request(request: &super::Request) -> crate::Result<Vec<Touched>> {
    let (patch, rev) = match &request.change {
        super::Change::Patch(path) => (
            std::fs::read(path).map_err(crate::io(format!("cannot read {}", path.display())))?,
            None,
        ),
        super::Change::Revs { a, b } => (super::tree::diff(&request.source, a, b)?, Some(a.as_str())),
    };
    let source = |path: &str| -> Option<String> {
        match rev {
            None => std::fs::read_to_string(request.source.join(path)).ok(),
            Some(rev) => std::process::Command::new("git")
                .arg("-C")
                .arg(&request.source)
                .arg("show")
                .arg(format!("{rev}:{path}"))
                .output()
                .ok()
                .filter(|out| out.status.success())
                .map(|out| String::from_utf8_lossy(&out.stdout).into_owned()),
        }
    };
    touched(&String::from_utf8_lossy(&patch), source).map_err(crate::Error::Invalid)
}

/// The functions of the file whose bodies call `name`.
fn callers_of(name: &str, spans: &[Span], lines: &[&str]) -> Vec<String> {
    let call = format!("{name}(");
    spans
        .iter()
        .filter(|s| s.name != name)
        .filter(|s| {
            lines[s.body..s.end.min(lines.len())].iter().any(|l| {
                l.match_indices(&call).any(|(i, _)| {
                    !l[..i]
                        .chars()
                        .next_back()
                        .is_some_and(|c| c.is_alphanumeric() || c == '_')
                })
            })
        })
        .map(|s| s.name.clone())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const SOURCE: &str = "\
#include <linux/pipe_fs_i.h>

static inline unsigned int pipe_occupancy(unsigned int head, unsigned int tail)
{
\treturn head - tail;
}

/*
 * A comment.
 */
static long pipe_set_size(struct pipe_inode_info *pipe,
\t\t\t  unsigned long arg)
{
\tunsigned int nr_slots;

\tnr_slots = arg;
\tif (nr_slots < pipe->max_usage)
\t\treturn -EBUSY;
\treturn pipe_resize_ring(pipe, nr_slots);
}

long pipe_fcntl(struct file *file, unsigned int cmd, unsigned long arg)
{
\tlong ret;

\t__pipe_lock(pipe);
\tret = pipe_set_size(pipe, arg);
\t__pipe_unlock(pipe);
\treturn ret;
}

SYSCALL_DEFINE2(pipe2, int __user *, fildes, int, flags)
{
\treturn do_pipe2(fildes, flags);
}

static const struct file_operations pipefifo_fops = {
\t.fcntl = pipe_fcntl,
};
";

    #[test]
    fn a_line_comment_above_a_signature_is_not_part_of_it() {
        let source = "// see pipe_write() for the other side\nstatic int f(int a)\n{\n\treturn a;\n}\n";
        let found: Vec<(String, usize)> = spans(source).into_iter().map(|s| (s.name, s.start)).collect();
        assert_eq!(found, vec![("f".to_owned(), 2)]);
    }

    #[test]
    fn bodies_are_found_kernel_style() {
        let found: Vec<(String, usize, usize, bool, bool)> = spans(SOURCE)
            .into_iter()
            .map(|s| (s.name, s.start, s.end, s.inline, s.is_static))
            .collect();
        assert_eq!(
            found,
            vec![
                ("pipe_occupancy".to_owned(), 3, 6, true, true),
                ("pipe_set_size".to_owned(), 11, 20, false, true),
                ("pipe_fcntl".to_owned(), 22, 30, false, false),
                ("SYSCALL_DEFINE2(pipe2)".to_owned(), 32, 35, false, false),
            ]
        );
    }

    fn source(path: &str) -> Option<String> {
        (path == "fs/pipe.c").then(|| SOURCE.to_owned())
    }

    #[test]
    fn a_change_names_the_function_around_it_and_where_it_runs_if_inlined() {
        // Stated at line 15, found at 16: an offset, as `patch` allows.
        let patch = "\
--- a/fs/pipe.c
+++ b/fs/pipe.c
@@ -15,3 +15,6 @@
 \tnr_slots = arg;
+\t__pipe_lock(pipe);
+\tnr_slots = pipe_occupancy(pipe->head, pipe->tail);
+\t__pipe_unlock(pipe);
 \tif (nr_slots < pipe->max_usage)
";
        let touched = touched(patch, source).unwrap();
        assert_eq!(
            touched,
            vec![Touched {
                file: "fs/pipe.c".to_owned(),
                function: "pipe_set_size".to_owned(),
                inline: false,
                is_static: true,
                callers: vec!["pipe_fcntl".to_owned()],
                added: false,
            }]
        );
    }

    #[test]
    fn removals_inlines_and_added_functions_are_named_once_each() {
        let patch = "\
diff --git a/fs/pipe.c b/fs/pipe.c
--- a/fs/pipe.c
+++ b/fs/pipe.c
@@ -4,3 +4,3 @@ static inline unsigned int pipe_occupancy
 {
-\treturn head - tail;
+\treturn (head - tail) & 0xffff;
 }
@@ -22,2 +22,6 @@
+static void pipe_helper(void)
+{
+}
+
 long pipe_fcntl(struct file *file, unsigned int cmd, unsigned long arg)
 {
@@ -27,3 +32,2 @@ long pipe_fcntl
 \tret = pipe_set_size(pipe, arg);
-\t__pipe_unlock(pipe);
 \treturn ret;
--- a/Documentation/x.rst
+++ b/Documentation/x.rst
@@ -1 +1 @@
-a
+b
";
        let found = touched(patch, source).unwrap();
        let named: Vec<(&str, bool, bool)> = found
            .iter()
            .map(|t| (t.function.as_str(), t.inline, t.added))
            .collect();
        assert_eq!(
            named,
            [
                ("pipe_occupancy", true, false),
                ("pipe_helper", false, true),
                ("pipe_fcntl", false, false)
            ]
        );
        let missing = "--- a/fs/pipe.c\n+++ b/fs/pipe.c\n@@ -1,1 +1,1 @@\n-no such line\n+x\n";
        assert_eq!(
            touched(missing, source).unwrap_err(),
            "fs/pipe.c: hunk #1 is not in the file"
        );
    }
}
