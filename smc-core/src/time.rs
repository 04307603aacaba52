//! Time as the core sees it: a monotonic instant the driver passes in.

use core::ops::{Add, Sub};
use core::time::Duration;

/// A point on the driver's monotonic clock, in nanoseconds since an epoch the driver picks
/// (the engine uses the first `std::time::Instant` it took; tests start at zero and jump).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Instant(u64);

impl Instant {
    /// The epoch.
    pub const ZERO: Instant = Instant(0);

    /// `nanos` after the epoch.
    pub const fn from_nanos(nanos: u64) -> Instant {
        Instant(nanos)
    }

    /// Nanoseconds after the epoch.
    pub const fn as_nanos(self) -> u64 {
        self.0
    }

    /// How long after `earlier` this is (zero if it is not later).
    pub fn saturating_duration_since(self, earlier: Instant) -> Duration {
        Duration::from_nanos(self.0.saturating_sub(earlier.0))
    }
}

impl Add<Duration> for Instant {
    type Output = Instant;
    fn add(self, d: Duration) -> Instant {
        let nanos = u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
        Instant(self.0.saturating_add(nanos))
    }
}

impl Sub<Instant> for Instant {
    type Output = Duration;
    fn sub(self, earlier: Instant) -> Duration {
        self.saturating_duration_since(earlier)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arithmetic_saturates() {
        let t = Instant::from_nanos(5);
        assert_eq!((t + Duration::from_nanos(7)).as_nanos(), 12);
        assert_eq!(Instant::ZERO - t, Duration::ZERO);
        assert_eq!(t - Instant::ZERO, Duration::from_nanos(5));
        assert_eq!((t + Duration::MAX).as_nanos(), u64::MAX);
    }
}
