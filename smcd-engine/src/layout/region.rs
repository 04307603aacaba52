//! A mapped shared-memory region (a sealed memfd) with checked access to aligned atomic words.
//!
//! Every page shared between `smcd` and engines is one of these: the writer creates the memfd,
//! maps it writable, seals it against resizing and against new writable mappings, and hands the
//! descriptor over; the reader maps it read-only after checking the seals and the size, so the
//! writer can neither make it shrink under the reader (no `SIGBUS`) nor be written by anyone
//! else. What the reader finds inside is still the writer's word and is validated before use.

use rustix::fd::{AsFd, OwnedFd};
use rustix::fs::{MemfdFlags, SealFlags};
use rustix::mm::{MapFlags, ProtFlags};
use std::io;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU32, AtomicU64};

/// A mapping of a whole memfd.
#[derive(Debug)]
pub struct Region {
    ptr: NonNull<u8>,
    len: usize,
    writable: bool,
}

// SAFETY: shared memory accessed only through atomics; valid for the value's lifetime.
unsafe impl Send for Region {}
// SAFETY: as above.
unsafe impl Sync for Region {}

impl Region {
    /// Creates a memfd of `len` bytes named `name`, maps it writable and seals it: no resize,
    /// and no writable mapping by anyone who receives the descriptor later. Returns the mapping
    /// and the descriptor to pass on.
    pub fn create(name: &str, len: usize) -> io::Result<(Region, OwnedFd)> {
        let fd = crate::sys::banded(rustix::fs::memfd_create(
            name,
            MemfdFlags::CLOEXEC | MemfdFlags::ALLOW_SEALING,
        )?);
        rustix::fs::ftruncate(&fd, len as u64)?;
        let region = Self::map(&fd, len, true)?;
        rustix::fs::fcntl_add_seals(
            &fd,
            SealFlags::SHRINK | SealFlags::GROW | SealFlags::FUTURE_WRITE | SealFlags::SEAL,
        )?;
        Ok((region, fd))
    }

    /// Maps a received descriptor read-only after checking that it is sealed against resizing
    /// and against writes by the receiver, and exactly `len` bytes long.
    pub fn open_read_only(fd: impl AsFd, len: usize) -> io::Result<Region> {
        let fd = fd.as_fd();
        let seals = rustix::fs::fcntl_get_seals(fd)?;
        if !seals.contains(SealFlags::SHRINK | SealFlags::GROW) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "region not sealed against resizing",
            ));
        }
        let st = rustix::fs::fstat(fd)?;
        if st.st_size as u64 != len as u64 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("region is {} bytes, expected {len}", st.st_size),
            ));
        }
        Self::map(fd, len, false)
    }

    fn map(fd: impl AsFd, len: usize, writable: bool) -> io::Result<Region> {
        let prot = if writable {
            ProtFlags::READ | ProtFlags::WRITE
        } else {
            ProtFlags::READ
        };
        // SAFETY: a new shared mapping of a file we checked (or created) to be `len` long;
        // nothing else refers to the range.
        let ptr =
            unsafe { rustix::mm::mmap(std::ptr::null_mut(), len, prot, MapFlags::SHARED, fd, 0)? };
        let ptr =
            NonNull::new(ptr.cast::<u8>()).ok_or_else(|| io::Error::other("mmap gave null"))?;
        Ok(Region { ptr, len, writable })
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the region is empty (never, in practice).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Whether this mapping may be written.
    pub fn writable(&self) -> bool {
        self.writable
    }

    /// The `u64` word at `off` (8-aligned, inside the region).
    ///
    /// # Panics
    /// If `off` is misaligned or out of range: offsets come from the layout constants, never
    /// from shared memory.
    pub fn u64_at(&self, off: usize) -> &AtomicU64 {
        assert!(
            off.is_multiple_of(8) && off + 8 <= self.len,
            "word {off} outside region"
        );
        // SAFETY: aligned, in bounds, lives as long as &self; AtomicU64 has u64's layout.
        unsafe { &*self.ptr.as_ptr().add(off).cast::<AtomicU64>() }
    }

    /// The `u32` word at `off` (4-aligned, inside the region).
    ///
    /// # Panics
    /// As [`Region::u64_at`].
    pub fn u32_at(&self, off: usize) -> &AtomicU32 {
        assert!(
            off.is_multiple_of(4) && off + 4 <= self.len,
            "word {off} outside region"
        );
        // SAFETY: as u64_at.
        unsafe { &*self.ptr.as_ptr().add(off).cast::<AtomicU32>() }
    }
}

impl Drop for Region {
    fn drop(&mut self) {
        // SAFETY: our own mapping; no borrow outlives self.
        let _ = unsafe { rustix::mm::munmap(self.ptr.as_ptr().cast(), self.len) };
    }
}

/// An anonymous region that is never shared (an engine without `smcd` keeps its counters in
/// one, so the data path has one code path).
pub fn private(len: usize) -> io::Result<Region> {
    let fd = rustix::fs::memfd_create("smc-private", MemfdFlags::CLOEXEC)?;
    rustix::fs::ftruncate(&fd, len as u64)?;
    Region::map(&fd, len, true)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::Ordering;

    #[test]
    fn reader_sees_writer_and_cannot_write() {
        let (w, fd) = Region::create("t", 4096).unwrap();
        let r = Region::open_read_only(&fd, 4096).unwrap();
        w.u64_at(8).store(42, Ordering::Release);
        assert_eq!(r.u64_at(8).load(Ordering::Acquire), 42);
        assert!(!r.writable());
        // A second writable mapping is refused by the seal.
        assert!(Region::map(&fd, 4096, true).is_err());
        assert!(Region::open_read_only(&fd, 8192).is_err());
        assert!(rustix::fs::ftruncate(&fd, 100).is_err());
    }
}
