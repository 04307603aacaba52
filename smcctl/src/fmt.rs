//! Formatting shared by the commands: smc-tools' number formats (`%#x`, `%#4x`, the
//! six-character abbreviations of `smcd stats`) and borderless aligned tables (comfy-table).

use comfy_table::{CellAlignment, ColumnConstraint, ContentArrangement, Table, Width, presets};
use serde::Serialize;

/// C's `%#x`: `0` for zero (the `0x` prefix only for non-zero values), else `0x` and hex.
pub fn alt_hex(v: u64) -> String {
    if v == 0 {
        "0".to_owned()
    } else {
        format!("{v:#x}")
    }
}

/// smc-tools' VLAN column, `%#4x`.
pub fn vlan(v: u8) -> String {
    format!("{:>4}", alt_hex(v.into()))
}

/// `Yes`/`No`, as smc-tools prints flags.
pub fn yes_no(b: bool) -> &'static str {
    if b { "Yes" } else { "No" }
}

/// A 64-bit id as 16 hex digits; with a non-zero extension (128-bit emulated-ISM GIDs such as
/// loopback-ism's), the 32 hex digits of both halves.
pub fn gid128(gid: u64, ext: Option<u64>) -> String {
    match ext {
        Some(e) if e != 0 => format!("{gid:016x}{e:016x}"),
        _ => format!("{gid:016x}"),
    }
}

/// The abbreviated counters of `smcd stats`: at most six characters. Below 1000 the number
/// itself; otherwise scaled by powers of 1000 (K, M, G, T, P) with as many decimals as fit
/// the six characters with the unit letter. When rounding would carry into a new digit, one
/// decimal is given up, or with none left the next unit is used.
pub fn abbreviate(n: u64) -> String {
    const WIDTH: usize = 6;
    let digits = n.checked_ilog10().map_or(1, |l| l as usize + 1);
    if digits < 4 {
        return n.to_string();
    }
    let layout = |digits: usize| -> (usize, usize, f64, char) {
        let mut whole = digits % 3;
        if whole == 0 {
            whole = 3;
        }
        let (mut places, mut whole_digits) = (WIDTH as isize - whole as isize - 2, whole);
        if places <= 0 {
            places = 0;
            whole_digits = WIDTH - 1;
        }
        let (unit, factor) = match digits {
            0..=6 => ('K', 1e3),
            7..=9 => ('M', 1e6),
            10..=12 => ('G', 1e9),
            13..=15 => ('T', 1e12),
            16..=18 => ('P', 1e15),
            _ => ('?', 1000f64.powi((digits / 3) as i32)),
        };
        (whole_digits, places as usize, factor, unit)
    };
    let (mut whole, mut places, mut factor, mut unit) = layout(digits);
    let mut value = n as f64 / factor;
    if value + 5.0 * 10f64.powi(-1 - places as i32) >= 10f64.powi(whole as i32) {
        if places > 0 {
            places -= 1;
        } else {
            (whole, places, factor, unit) = layout(digits + 1);
            value = n as f64 / factor;
        }
    }
    let _ = whole;
    format!("{value:>w$.p$}{unit}", w = WIDTH - 1, p = places)
}

/// A percentage of `part` in `whole` (0 when `whole` is 0), as `%.2f` shows it.
pub fn percent(part: u64, whole: u64) -> f64 {
    if whole == 0 {
        0.0
    } else {
        part as f64 / whole as f64 * 100.0
    }
}

/// Column alignment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Align {
    /// Text.
    Left,
    /// Numbers.
    Right,
}

/// A borderless table: columns separated by two blanks, no trailing blanks, the header in
/// the first line (smc-tools' layout).
pub fn table(columns: &[(&str, Align)], rows: &[Vec<String>]) -> String {
    table_min(columns, rows, 0)
}

/// [`table`] with every column after the first at least `min_width` characters wide (the
/// fixed `%6s` columns of `smcd stats`).
pub fn table_min(columns: &[(&str, Align)], rows: &[Vec<String>], min_width: u16) -> String {
    let mut t = Table::new();
    t.load_style(presets::NOTHING)
        .force_no_tty()
        .set_content_arrangement(ContentArrangement::Disabled)
        .set_header(columns.iter().map(|(h, _)| *h).collect::<Vec<_>>());
    for r in rows {
        t.add_row(r.clone());
    }
    let last = columns.len().saturating_sub(1);
    for (i, col) in t.column_iter_mut().enumerate() {
        let pad = if i == last { 0 } else { 2 };
        col.set_padding((0, pad));
        if i > 0 && min_width > 0 {
            col.set_constraint(ColumnConstraint::LowerBoundary(Width::Fixed(
                min_width + pad,
            )));
        }
        if columns.get(i).is_some_and(|(_, a)| *a == Align::Right) {
            col.set_cell_alignment(CellAlignment::Right);
        }
    }
    let mut s = t.trim_fmt();
    s.push('\n');
    s
}

/// `--json` output: pretty-printed, one trailing newline.
pub fn json<T: Serialize>(value: &T) -> String {
    // Serializing plain data structs with string keys cannot fail.
    let mut s = serde_json::to_string_pretty(value).unwrap_or_else(|_| "null".to_owned());
    s.push('\n');
    s
}

/// Key/value blocks of `linkgroup show -d`: the key padded to nine characters, then `: `.
pub fn kv(out: &mut String, key: &str, value: impl std::fmt::Display) {
    use std::fmt::Write;
    let _ = writeln!(out, "{key:<9}: {value}");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn c_hex_forms() {
        assert_eq!(alt_hex(0), "0");
        assert_eq!(alt_hex(0x1f), "0x1f");
        assert_eq!(vlan(0), "   0");
        assert_eq!(vlan(5), " 0x5");
        assert_eq!(vlan(0xff), "0xff");
        assert_eq!(gid128(1, None), "0000000000000001");
        assert_eq!(gid128(1, Some(0)), "0000000000000001");
        assert_eq!(gid128(1, Some(2)), "00000000000000010000000000000002");
    }

    #[test]
    fn abbreviations_fit_six_characters() {
        assert_eq!(abbreviate(0), "0");
        assert_eq!(abbreviate(7), "7");
        assert_eq!(abbreviate(999), "999");
        assert_eq!(abbreviate(1234), "1.234K");
        assert_eq!(abbreviate(12345), "12.35K");
        assert_eq!(abbreviate(123456), "123.5K");
        assert_eq!(abbreviate(1_234_567), "1.235M");
        assert_eq!(abbreviate(9999), "9.999K");
        assert_eq!(abbreviate(9_999_999), "10.00M");
        assert_eq!(abbreviate(99_999), "100.0K");
        assert_eq!(abbreviate(999_999), " 1000K");
        assert_eq!(abbreviate(5_000_000_000), "5.000G");
        assert_eq!(abbreviate(1_500_000_000_000), "1.500T");
        for n in [1000u64, 65535, 1 << 20, 1 << 40, u64::MAX / 3] {
            assert!(abbreviate(n).len() <= 6, "{n} -> {}", abbreviate(n));
        }
    }

    #[test]
    fn tables_are_aligned_without_borders() {
        let t = table(
            &[
                ("LG-ID", Align::Left),
                ("#Conns", Align::Right),
                ("PNET-ID", Align::Left),
            ],
            &[
                vec!["00000100".into(), "2".into(), "".into()],
                vec!["00000200".into(), "10".into(), "NET1".into()],
            ],
        );
        assert_eq!(
            t,
            "LG-ID     #Conns  PNET-ID\n00000100       2\n00000200      10  NET1\n"
        );
    }

    #[test]
    fn minimum_widths() {
        let t = table_min(
            &[
                ("", Align::Left),
                ("8KB", Align::Right),
                ("16KB", Align::Right),
            ],
            &[vec!["Bufs".into(), "0".into(), "1.500K".into()]],
            6,
        );
        assert_eq!(t, "         8KB    16KB\nBufs       0  1.500K\n");
    }

    #[test]
    fn percentages() {
        assert_eq!(percent(1, 0), 0.0);
        assert_eq!(percent(1, 4), 25.0);
    }
}
