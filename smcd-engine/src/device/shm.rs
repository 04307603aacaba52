//! DMB memory: memfd-backed, sealed, mapped shared by exactly the two endpoints of a link
//! group (the kernel's `smc_lo_register_dmb` / `smc_lo_attach_dmb` in `smc_loopback.c`, with
//! a file descriptor instead of a kernel pointer).
//!
//! # Layout of one DMB memfd
//!
//! ```text
//! 0            8          16              24          32                       dmb_len
//! | type 0xFE  | prod     | cons + flags  | reserved  | ring (dmb_len - 32)  ...  |
//! |  (kernel SMC-D CDC header, written by the peer)   |  data written by the peer |
//! dmb_len                 +64                 +128                    +192
//! | rx_waiting (u32),     | tx_waiting (u32)  | bell locator            | owner_fetches (u32) | ...
//! | rx sleep tag (u64)    |                   |                         |                     |
//! ```
//!
//! The first `dmb_len` bytes are exactly the kernel's SMC-D DMB: a 32-byte CDC header
//! (`smc_proto::cdc`) the peer writes, then the ring the peer writes data into. The two cursor
//! slots are 8-byte aligned words that the kernel itself treats as `atomic64_t`; here they are
//! stored and loaded as [`AtomicU64`] so a reader never sees a torn cursor.
//!
//! The page after the DMB is the engine's own: the owner announces there that it waits (one
//! word per direction, each on its own cache line so the peer's hot-path load of one does not
//! contend with the owner's other thread). The kernel needs no such words because its loopback
//! device calls the receiver's tasklet directly. The CDC's reserved word (bytes 24..32, which
//! the kernel never reads) carries the connection's epoch: the owner writes a fresh one for
//! every connection that uses the DMB, and the attacher finds its readiness bell by it.
//!
//! The bell locator (owner-written: pid, descriptor number and inode of the far end of the
//! connection's readiness pair) lets the attacher take the bell straight from the owner's
//! process with `pidfd_getfd`; `owner_fetches` (owner-written, with the connection's epoch)
//! tells the attacher that the owner takes the attacher's bells that way, so the attacher need
//! not send its bell through the link group's channel (`transport::smcd`).
//!
//! # Trust
//!
//! The peer can write anything into this memory at any time. Everything read from it is either
//! an atomic word (validated by the connection before use) or plain bytes copied out of the
//! ring (any value is a valid `u8`). The mapping never shrinks under us: the memfd is sealed
//! against resizing before it is handed out, and [`DmbMap::map`] refuses one that is not.

use rustix::fd::{AsFd, OwnedFd};
use rustix::fs::{MemfdFlags, SealFlags};
use rustix::mm::{MapFlags, ProtFlags};
use std::io;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU32, AtomicU64};

/// Bytes of the SMC-D CDC header at the start of every DMB.
pub const DMB_HEADER_LEN: usize = 32;
/// Offset of the producer cursor word in the DMB header.
pub const PROD_OFFSET: usize = 8;
/// Offset of the consumer cursor + flags word in the DMB header.
pub const CONS_OFFSET: usize = 16;
/// Bytes of engine metadata after the DMB.
pub const META_LEN: usize = 4096;
/// Offset of the owner's "reader is about to sleep" word within the metadata page.
const RX_WAITING_OFFSET: usize = 0;
/// Offset of the owner's sleep tag for its reader (u64, on the reader word's cache line): which
/// of the owner's waits on descriptors the announcement belongs to (see `Dmb::take_ring`).
const RX_SLEEP_TAG_OFFSET: usize = 8;
/// Offset of the owner's "writer is about to sleep" word within the metadata page.
const TX_WAITING_OFFSET: usize = 64;
/// Offset of the owner's bell locator (pid u32, descriptor u32, inode u64) in the metadata page.
const BELL_LOC_OFFSET: usize = 128;
/// Offset of the owner's "I take your bells with pidfd_getfd" word in the metadata page.
const OWNER_FETCHES_OFFSET: usize = 192;

/// Smallest DMB (the kernel's `SMC_BUF_MIN_SIZE`).
pub const DMB_MIN_LEN: usize = 16 * 1024;
/// Largest DMB (compressed size code 6 for SMC-D).
pub const DMB_MAX_LEN: usize = 1024 * 1024;

/// Creates a sealed memfd for a DMB of `dmb_len` bytes plus the metadata page. Used by the
/// device owner (`smcd`, or the in-process device in tests).
pub fn create_dmb_memfd(dmb_len: usize) -> io::Result<OwnedFd> {
    check_dmb_len(dmb_len)?;
    let fd = crate::sys::banded(rustix::fs::memfd_create(
        "smc-dmb",
        MemfdFlags::CLOEXEC | MemfdFlags::ALLOW_SEALING,
    )?);
    rustix::fs::ftruncate(&fd, (dmb_len + META_LEN) as u64)?;
    // Sealed before anyone else sees it: nobody can shrink it (no SIGBUS on access), grow it,
    // or remove the seals.
    rustix::fs::fcntl_add_seals(&fd, SealFlags::SHRINK | SealFlags::GROW | SealFlags::SEAL)?;
    Ok(fd)
}

fn check_dmb_len(dmb_len: usize) -> io::Result<()> {
    if !(DMB_MIN_LEN..=DMB_MAX_LEN).contains(&dmb_len) || !dmb_len.is_power_of_two() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("DMB size {dmb_len} is not a power of two between 16 KiB and 1 MiB"),
        ));
    }
    Ok(())
}

/// A shared mapping of one DMB memfd (DMB + metadata page).
#[derive(Debug)]
pub struct DmbMap {
    ptr: NonNull<u8>,
    dmb_len: usize,
}

// SAFETY: the mapping is plain shared memory valid for the life of the value; all access goes
// through atomics or byte copies that tolerate concurrent modification by the peer.
unsafe impl Send for DmbMap {}
// SAFETY: as above; `&DmbMap` hands out only atomics and copy operations.
unsafe impl Sync for DmbMap {}

impl DmbMap {
    /// Maps `fd`, which must be a sealed memfd of exactly `dmb_len + META_LEN` bytes.
    pub fn map(fd: impl AsFd, dmb_len: usize) -> io::Result<Self> {
        check_dmb_len(dmb_len)?;
        let fd = fd.as_fd();
        let seals = rustix::fs::fcntl_get_seals(fd)?;
        if !seals.contains(SealFlags::SHRINK | SealFlags::GROW) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "DMB memfd is not sealed against resizing",
            ));
        }
        let st = rustix::fs::fstat(fd)?;
        if st.st_size as u64 != (dmb_len + META_LEN) as u64 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!(
                    "DMB memfd is {} bytes, expected {}",
                    st.st_size,
                    dmb_len + META_LEN
                ),
            ));
        }
        // SAFETY: a fresh shared mapping of a sealed file whose size we just checked; nothing
        // else in this process refers to the address range we get back.
        let ptr = unsafe {
            rustix::mm::mmap(
                std::ptr::null_mut(),
                dmb_len + META_LEN,
                ProtFlags::READ | ProtFlags::WRITE,
                MapFlags::SHARED,
                fd,
                0,
            )?
        };
        let ptr =
            NonNull::new(ptr.cast::<u8>()).ok_or_else(|| io::Error::other("mmap gave null"))?;
        Ok(Self { ptr, dmb_len })
    }

    /// Size of the DMB (what the compressed size code describes).
    pub fn dmb_len(&self) -> usize {
        self.dmb_len
    }

    /// Size of the data ring: the DMB minus its CDC header.
    pub fn ring_len(&self) -> usize {
        self.dmb_len - DMB_HEADER_LEN
    }

    fn atomic_u64(&self, offset: usize) -> &AtomicU64 {
        debug_assert!(offset.is_multiple_of(8) && offset + 8 <= self.dmb_len + META_LEN);
        // SAFETY: offset is 8-aligned inside the mapping (page-aligned base), the mapping lives
        // as long as &self, and AtomicU64 has the same layout as u64.
        unsafe { &*self.ptr.as_ptr().add(offset).cast::<AtomicU64>() }
    }

    fn atomic_u32(&self, offset: usize) -> &AtomicU32 {
        debug_assert!(offset.is_multiple_of(4) && offset + 4 <= self.dmb_len + META_LEN);
        // SAFETY: as for atomic_u64, with 4-byte alignment.
        unsafe { &*self.ptr.as_ptr().add(offset).cast::<AtomicU32>() }
    }

    /// The producer-cursor word of the CDC header (written by the peer that sends into this DMB).
    pub fn prod_word(&self) -> &AtomicU64 {
        self.atomic_u64(PROD_OFFSET)
    }

    /// The consumer-cursor + flags word of the CDC header (written by the same peer).
    pub fn cons_word(&self) -> &AtomicU64 {
        self.atomic_u64(CONS_OFFSET)
    }

    /// The owner's "reader about to sleep" word, read by the peer after it publishes data.
    pub fn rx_waiting(&self) -> &AtomicU32 {
        self.atomic_u32(self.dmb_len + RX_WAITING_OFFSET)
    }

    /// The owner's sleep tag for its reader's announcement (see `Dmb::take_ring`).
    pub fn rx_sleep_tag(&self) -> &AtomicU64 {
        self.atomic_u64(self.dmb_len + RX_SLEEP_TAG_OFFSET)
    }

    /// The owner's "writer about to sleep" word, read by the peer after it frees space.
    pub fn tx_waiting(&self) -> &AtomicU32 {
        self.atomic_u32(self.dmb_len + TX_WAITING_OFFSET)
    }

    /// The owner's bell locator: process id and descriptor number (see the module docs).
    pub fn bell_pid_fd(&self) -> (&AtomicU32, &AtomicU32) {
        (
            self.atomic_u32(self.dmb_len + BELL_LOC_OFFSET),
            self.atomic_u32(self.dmb_len + BELL_LOC_OFFSET + 4),
        )
    }

    /// The owner's bell locator: inode of the bell (checked after fetching it).
    pub fn bell_ino(&self) -> &AtomicU64 {
        self.atomic_u64(self.dmb_len + BELL_LOC_OFFSET + 8)
    }

    /// Written by the owner: non-zero when it takes the attacher's bells with `pidfd_getfd`.
    pub fn owner_fetches(&self) -> &AtomicU32 {
        self.atomic_u32(self.dmb_len + OWNER_FETCHES_OFFSET)
    }

    /// The connection epoch in the CDC's reserved word (see the module docs).
    pub fn epoch_word(&self) -> &AtomicU64 {
        self.atomic_u64(smc_proto::cdc::ENGINE_WORD_OFFSET)
    }

    /// Resets the header and metadata for a new connection (the kernel clears a reused RMB's
    /// header in `smc_buf_create` the same way).
    pub fn reset(&self) {
        use std::sync::atomic::Ordering::Relaxed;
        self.prod_word().store(0, Relaxed);
        self.cons_word().store(0, Relaxed);
        self.atomic_u64(24).store(0, Relaxed);
        // Byte 0 is the CDC type 0xFE, bytes 1..8 reserved.
        self.atomic_u64(0)
            .store(u64::from_ne_bytes([0xFE, 0, 0, 0, 0, 0, 0, 0]), Relaxed);
        self.rx_waiting().store(0, Relaxed);
        self.rx_sleep_tag().store(0, Relaxed);
        self.tx_waiting().store(0, Relaxed);
        let (pid, fd) = self.bell_pid_fd();
        pid.store(0, Relaxed);
        fd.store(0, Relaxed);
        self.bell_ino().store(0, Relaxed);
        self.owner_fetches().store(0, Relaxed);
    }

    /// Copies `data` into the ring starting at ring offset `at` (`at < ring_len`), wrapping at
    /// the end. `data.len()` must not exceed the ring length.
    pub fn write_ring(&self, at: usize, data: &[u8]) {
        let ring = self.ring_len();
        assert!(at < ring && data.len() <= ring, "ring write out of bounds");
        let first = data.len().min(ring - at);
        // SAFETY: both chunks lie inside the ring [32, dmb_len) of a live mapping; the source
        // is ordinary process memory that cannot overlap the mapping.
        unsafe {
            let base = self.ptr.as_ptr().add(DMB_HEADER_LEN);
            std::ptr::copy_nonoverlapping(data.as_ptr(), base.add(at), first);
            if first < data.len() {
                std::ptr::copy_nonoverlapping(data.as_ptr().add(first), base, data.len() - first);
            }
        }
    }

    /// Copies `out.len()` bytes out of the ring starting at ring offset `at`, wrapping at the
    /// end. The peer may be writing elsewhere in the ring meanwhile; bytes are bytes.
    pub fn read_ring(&self, at: usize, out: &mut [u8]) {
        let ring = self.ring_len();
        assert!(at < ring && out.len() <= ring, "ring read out of bounds");
        let first = out.len().min(ring - at);
        // SAFETY: as write_ring, in the other direction.
        unsafe {
            let base = self.ptr.as_ptr().add(DMB_HEADER_LEN);
            std::ptr::copy_nonoverlapping(base.add(at), out.as_mut_ptr(), first);
            if first < out.len() {
                std::ptr::copy_nonoverlapping(base, out.as_mut_ptr().add(first), out.len() - first);
            }
        }
    }

    /// Writes arbitrary bytes at an arbitrary DMB offset: only for tests that play a hostile
    /// peer.
    #[doc(hidden)]
    pub fn scribble(&self, at: usize, data: &[u8]) {
        assert!(at + data.len() <= self.dmb_len + META_LEN);
        // SAFETY: inside the mapping; concurrent readers tolerate any bytes.
        unsafe {
            std::ptr::copy_nonoverlapping(data.as_ptr(), self.ptr.as_ptr().add(at), data.len())
        };
    }
}

impl Drop for DmbMap {
    fn drop(&mut self) {
        // SAFETY: we own this mapping and nothing borrows from it once we are dropped.
        let _ = unsafe { rustix::mm::munmap(self.ptr.as_ptr().cast(), self.dmb_len + META_LEN) };
    }
}

pub use crate::sys::random_u64;

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::Ordering;

    #[test]
    fn two_mappings_share_memory_and_wrap() {
        let fd = create_dmb_memfd(DMB_MIN_LEN).unwrap();
        let a = DmbMap::map(&fd, DMB_MIN_LEN).unwrap();
        let b = DmbMap::map(&fd, DMB_MIN_LEN).unwrap();
        a.reset();
        let ring = a.ring_len();
        assert_eq!(ring, DMB_MIN_LEN - 32);
        let data: Vec<u8> = (0..100u8).collect();
        a.write_ring(ring - 10, &data);
        let mut out = vec![0u8; 100];
        b.read_ring(ring - 10, &mut out);
        assert_eq!(out, data);
        a.prod_word().store(77, Ordering::Release);
        assert_eq!(b.prod_word().load(Ordering::Acquire), 77);
        b.rx_waiting().store(1, Ordering::Relaxed);
        assert_eq!(a.rx_waiting().load(Ordering::Relaxed), 1);
    }

    #[test]
    fn sealed_against_resize() {
        let fd = create_dmb_memfd(DMB_MIN_LEN).unwrap();
        assert!(rustix::fs::ftruncate(&fd, 10).is_err());
        assert!(rustix::fs::ftruncate(&fd, (DMB_MIN_LEN * 4) as u64).is_err());
    }

    #[test]
    fn refuses_unsealed_or_wrong_size() {
        let fd = rustix::fs::memfd_create("x", MemfdFlags::CLOEXEC).unwrap();
        rustix::fs::ftruncate(&fd, (DMB_MIN_LEN + META_LEN) as u64).unwrap();
        assert!(DmbMap::map(&fd, DMB_MIN_LEN).is_err());
        let fd = create_dmb_memfd(DMB_MIN_LEN).unwrap();
        assert!(DmbMap::map(&fd, DMB_MIN_LEN * 2).is_err());
        assert!(create_dmb_memfd(1000).is_err());
    }
}
