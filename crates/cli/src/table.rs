//! Plain aligned text tables, the way `kubectl get` prints them: a header row in capitals, columns
//! separated by two spaces, no borders, so `grep`/`awk` still work on the output.
//!
//! Hand-written (about 40 lines) rather than a table crate: we need no borders, colours or wrapping,
//! only column alignment by display width.

/// A table being built row by row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Table {
    headers: Vec<String>,
    rows: Vec<Vec<String>>,
}

impl Table {
    pub fn new<I, S>(headers: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        Table {
            headers: headers.into_iter().map(Into::into).collect(),
            rows: Vec::new(),
        }
    }

    /// Adds a row; missing cells are empty, extra cells are dropped.
    pub fn row<I, S>(&mut self, cells: I)
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        let mut cells: Vec<String> = cells.into_iter().map(|c| clean_cell(&c.into())).collect();
        cells.resize(self.headers.len(), String::new());
        self.rows.push(cells);
    }

    /// The table as text, one line per row, each ending in a newline; trailing spaces trimmed.
    pub fn render(&self) -> String {
        let mut widths: Vec<usize> = self.headers.iter().map(|h| display_width(h)).collect();
        for row in &self.rows {
            for (width, cell) in widths.iter_mut().zip(row) {
                *width = (*width).max(display_width(cell));
            }
        }
        let mut out = String::new();
        let header_row: Vec<String> = self.headers.iter().map(|h| h.to_uppercase()).collect();
        for row in std::iter::once(&header_row).chain(&self.rows) {
            let mut line = String::new();
            for (i, (cell, width)) in row.iter().zip(&widths).enumerate() {
                if i > 0 {
                    line.push_str("  ");
                }
                line.push_str(cell);
                line.extend(std::iter::repeat_n(' ', width - display_width(cell)));
            }
            out.push_str(line.trim_end());
            out.push('\n');
        }
        out
    }
}

/// Width in terminal columns, counting each char as one (good enough for IDs, names and times).
fn display_width(text: &str) -> usize {
    text.chars().count()
}

/// A cell must stay on one line: control characters (newlines, tabs, escapes) become spaces.
fn clean_cell(text: &str) -> String {
    text.chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn aligns_columns_by_the_widest_cell() {
        let mut table = Table::new(["id", "state"]);
        table.row(["a", "running"]);
        table.row(["longer-id", "paused"]);
        assert_eq!(
            table.render(),
            "ID         STATE\na          running\nlonger-id  paused\n"
        );
    }

    #[test]
    fn header_only_when_empty() {
        let table = Table::new(["id", "name"]);
        assert_eq!(table.render(), "ID  NAME\n");
    }

    #[test]
    fn short_rows_are_padded_and_long_rows_cut() {
        let mut table = Table::new(["a", "b", "c"]);
        table.row(["1"]);
        table.row(["1", "2", "3", "4"]);
        assert_eq!(table.render(), "A  B  C\n1\n1  2  3\n");
    }

    #[test]
    fn control_characters_cannot_break_lines() {
        let mut table = Table::new(["k", "v"]);
        table.row(["x", "two\nlines\t\x1b[31m"]);
        let text = table.render();
        assert_eq!(text.lines().count(), 2, "{text:?}");
        assert!(!text.contains('\x1b'));
    }

    #[test]
    fn counts_characters_not_bytes() {
        let mut table = Table::new(["name", "n"]);
        table.row(["äöü", "1"]);
        table.row(["abcd", "2"]);
        assert_eq!(table.render(), "NAME  N\näöü   1\nabcd  2\n");
    }
}
