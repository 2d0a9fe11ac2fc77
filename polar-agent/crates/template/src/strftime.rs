//! C `strftime` for the templates' `strftime_now` (Llama 3.x writes
//! `strftime_now("%d %b %Y")` into its system prompt): the directives of
//! the C locale Python passes through to glibc, glibc's `%-d` style flag
//! for no padding, and unknown directives kept as written, as glibc does.

use std::fmt::Write as _;

use time::OffsetDateTime;

const MONTHS: [&str; 12] = [
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
];
const DAYS: [&str; 7] = [
    "Monday",
    "Tuesday",
    "Wednesday",
    "Thursday",
    "Friday",
    "Saturday",
    "Sunday",
];

/// `t` formatted by `format`.
pub fn format(t: OffsetDateTime, format: &str) -> String {
    let mut out = String::new();
    let mut chars = format.chars().peekable();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        let pad = chars.next_if_eq(&'-').is_none();
        let Some(d) = chars.next() else {
            out.push('%');
            if !pad {
                out.push('-');
            }
            break;
        };
        let num = |out: &mut String, n: i64, width: usize| {
            if pad {
                let _ = write!(out, "{n:0width$}");
            } else {
                let _ = write!(out, "{n}");
            }
        };
        let month = usize::from(u8::from(t.month())) - 1;
        let weekday = usize::from(t.weekday().number_days_from_monday());
        let hour12 = match t.hour() % 12 {
            0 => 12,
            h => h,
        };
        match d {
            'Y' => num(&mut out, i64::from(t.year()), 0),
            'y' => num(&mut out, i64::from(t.year().rem_euclid(100)), 2),
            'm' => num(&mut out, i64::from(u8::from(t.month())), 2),
            'd' => num(&mut out, i64::from(t.day()), 2),
            'e' => {
                let _ = write!(out, "{:>2}", t.day());
            }
            'j' => num(&mut out, i64::from(t.ordinal()), 3),
            'H' => num(&mut out, i64::from(t.hour()), 2),
            'I' => num(&mut out, i64::from(hour12), 2),
            'M' => num(&mut out, i64::from(t.minute()), 2),
            'S' => num(&mut out, i64::from(t.second()), 2),
            'f' => num(&mut out, i64::from(t.microsecond()), 6),
            'p' => out.push_str(if t.hour() < 12 { "AM" } else { "PM" }),
            'B' => out.push_str(MONTHS[month]),
            'b' | 'h' => out.push_str(&MONTHS[month][..3]),
            'A' => out.push_str(DAYS[weekday]),
            'a' => out.push_str(&DAYS[weekday][..3]),
            'u' => num(&mut out, weekday as i64 + 1, 0),
            'w' => num(&mut out, (weekday as i64 + 1) % 7, 0),
            'F' => {
                let _ = write!(
                    out,
                    "{}-{:02}-{:02}",
                    t.year(),
                    u8::from(t.month()),
                    t.day()
                );
            }
            'T' => {
                let _ = write!(out, "{:02}:{:02}:{:02}", t.hour(), t.minute(), t.second());
            }
            'Z' => out.push_str("UTC"),
            'z' => out.push_str("+0000"),
            'n' => out.push('\n'),
            't' => out.push('\t'),
            '%' => out.push('%'),
            other => {
                out.push('%');
                if !pad {
                    out.push('-');
                }
                out.push(other);
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_c_locale_directives() {
        let t = time::macros::datetime!(2026-07-04 09:05:03 UTC);
        assert_eq!(format(t, "%d %b %Y"), "04 Jul 2026");
        assert_eq!(format(t, "%-d %B %Y"), "4 July 2026");
        assert_eq!(format(t, "%A %a %j %y %m"), "Saturday Sat 185 26 07");
        assert_eq!(
            format(t, "%H:%M:%S %I%p %F %T"),
            "09:05:03 09AM 2026-07-04 09:05:03"
        );
        assert_eq!(format(t, "100%% %Q %"), "100% %Q %");
    }
}
