//! Stop strings in streamed text: text that could still be the start of a stop string is
//! held back until it is known not to be one.

/// Finds stop strings in text that arrives piece by piece, releasing only text that can
/// no longer be part of one.
///
/// ```
/// use etch_llm::StopStrings;
/// let mut stops = StopStrings::new(&["</end>".to_string()]);
/// // The last 5 bytes (the stop's length less one) wait: they may start "</end>".
/// assert_eq!(stops.push("Hello </e"), ("Hell", false));
/// // The text before the stop comes out; the stop and what follows are dropped.
/// assert_eq!(stops.push("nd> rest"), ("o ", true));
/// ```
#[derive(Debug, Default, Clone)]
pub struct StopStrings {
    stops: Vec<String>,
    /// Bytes of the longest stop string minus one: the most text that can be held.
    hold: usize,
    pending: String,
    released: String,
}

impl StopStrings {
    /// Watches for `stops` (empty strings are ignored).
    pub fn new(stops: &[String]) -> Self {
        let stops: Vec<String> = stops.iter().filter(|s| !s.is_empty()).cloned().collect();
        let hold = stops.iter().map(String::len).max().unwrap_or(1) - 1;
        Self {
            pending: String::with_capacity(4 * (hold + 1) + 64),
            released: String::with_capacity(4 * (hold + 1) + 64),
            stops,
            hold,
        }
    }

    /// Whether there is any stop string to watch for.
    pub fn is_empty(&self) -> bool {
        self.stops.is_empty()
    }

    /// Adds `text`; returns the text now safe to emit and whether a stop string was
    /// found. After a hit, the stop string and everything after it are dropped.
    pub fn push(&mut self, text: &str) -> (&str, bool) {
        self.released.clear();
        self.pending.push_str(text);
        let hit = self
            .stops
            .iter()
            .filter_map(|s| self.pending.find(s.as_str()))
            .min();
        let safe = match hit {
            Some(at) => at,
            None if self.pending.len() <= self.hold => 0,
            None => floor_char_boundary(&self.pending, self.pending.len() - self.hold),
        };
        self.released.push_str(&self.pending[..safe]);
        if hit.is_some() {
            self.pending.clear();
        } else {
            self.pending.drain(..safe);
        }
        (&self.released, hit.is_some())
    }

    /// Releases everything held back (the text ended without a stop string).
    pub fn flush(&mut self) -> &str {
        self.released.clear();
        std::mem::swap(&mut self.released, &mut self.pending);
        &self.released
    }
}

/// The largest char boundary of `s` at or before `at`.
fn floor_char_boundary(s: &str, mut at: usize) -> usize {
    while !s.is_char_boundary(at) {
        at -= 1;
    }
    at
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stops(list: &[&str]) -> StopStrings {
        StopStrings::new(&list.iter().map(|s| s.to_string()).collect::<Vec<_>>())
    }

    #[test]
    fn without_stops_everything_passes() {
        let mut s = stops(&[]);
        assert!(s.is_empty());
        assert_eq!(s.push("abc"), ("abc", false));
        assert_eq!(s.flush(), "");
    }

    #[test]
    fn holds_back_what_could_start_a_stop() {
        let mut s = stops(&["STOP", "XY"]);
        // Holds the last 3 bytes (the longest stop, less one).
        assert_eq!(s.push("abcS"), ("a", false));
        assert_eq!(s.push("T"), ("b", false));
        assert_eq!(s.push("x"), ("c", false));
        assert_eq!(s.flush(), "STx");
    }

    #[test]
    fn the_earliest_stop_wins_and_the_rest_is_dropped() {
        let mut s = stops(&["bb", "a"]);
        assert_eq!(s.push("xxbbya"), ("xx", true));
        assert_eq!(s.flush(), "");
    }

    #[test]
    fn never_splits_a_character() {
        let mut s = stops(&["zzzz"]);
        // "é€" is 2 + 3 bytes; holding 3 bytes must not cut the euro sign.
        let (out, hit) = s.push("aé€");
        assert!(!hit);
        assert_eq!(out, "aé");
        assert_eq!(s.flush(), "€");
    }

    proptest::proptest! {
        #[test]
        fn released_text_is_the_input_up_to_the_first_stop(
            pieces in proptest::collection::vec("[ab€]{0,4}", 0..8),
        ) {
            let mut s = stops(&["ab€", "bb"]);
            let whole: String = pieces.concat();
            let mut out = String::new();
            let mut hit = false;
            for p in &pieces {
                let (text, h) = s.push(p);
                out.push_str(text);
                if h {
                    hit = true;
                    break;
                }
            }
            if !hit {
                out.push_str(s.flush());
            }
            let first = ["ab€", "bb"].iter().filter_map(|x| whole.find(x)).min();
            match first {
                Some(at) => {
                    proptest::prop_assert!(hit);
                    proptest::prop_assert_eq!(&out, &whole[..at]);
                }
                None => proptest::prop_assert_eq!(&out, &whole),
            }
        }
    }
}
