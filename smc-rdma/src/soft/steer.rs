//! How a RoCEv2 datagram reaches the process that owns its QP when several processes have a
//! soft device on the same address (the destination port is always 4791).
//!
//! Every such device binds `(address, 4791)` with `SO_REUSEPORT`, so their sockets form one
//! reuseport group, and the group runs a BPF `sk_reuseport` program that reads the
//! destination QPN from the BTH and picks the socket in slot `QPN >> 12` of a
//! `REUSEPORT_SOCKARRAY` map. A device takes a free slot when it opens (an update with
//! `BPF_NOEXIST`) and makes its QPNs `slot << 12 | n`; the kernel empties the slot when the
//! socket closes. A datagram whose slot is empty falls to the group's hash and lands in some
//! device, which drops it as a packet for an unknown QP (counted).
//!
//! Failure semantics: the program and the map are kernel objects held by the sockets that use
//! them, so established QPs keep working whoever created them (smcd) stops; a process that
//! exits frees its slot and its peers' packets for it are dropped, as for a vanished host.
//! Without steering (no privilege to load the program), a device binds its address alone: one
//! device per address and namespace.
//!
//! The program is twenty-two instruction slots, assembled here rather than compiled: no clang, no ELF
//! loader, and the verifier checks it at load time like any other.

use rustix::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::io;

/// QPN bits below the slot.
pub const SLOT_SHIFT: u32 = 12;
/// Slots in the map (24-bit QPNs: 2^12 slots of 2^12 QPs).
pub const SLOTS: u32 = 1 << (24 - SLOT_SHIFT);

const BPF_MAP_CREATE: libc::c_long = 0;
const BPF_MAP_UPDATE_ELEM: libc::c_long = 2;
const BPF_PROG_LOAD: libc::c_long = 5;
const MAP_TYPE_REUSEPORT_SOCKARRAY: u32 = 20;
const PROG_TYPE_SK_REUSEPORT: u32 = 21;
const ATTACH_SK_REUSEPORT_SELECT: u32 = 39;
const BPF_NOEXIST: u64 = 1;
const FUNC_SKB_LOAD_BYTES: i32 = 26;
const FUNC_SK_SELECT_REUSEPORT: i32 = 82;
const SO_ATTACH_REUSEPORT_EBPF: i32 = 52;
const SOL_SOCKET: i32 = 1;

/// A shared steering program and its socket map. Cloning shares the same kernel objects.
#[derive(Debug)]
pub struct Steering {
    prog: OwnedFd,
    map: OwnedFd,
}

#[repr(C)]
#[derive(Default)]
struct MapCreate {
    map_type: u32,
    key_size: u32,
    value_size: u32,
    max_entries: u32,
    map_flags: u32,
}

#[repr(C)]
#[derive(Default)]
struct ProgLoad {
    prog_type: u32,
    insn_cnt: u32,
    insns: u64,
    license: u64,
    log_level: u32,
    log_size: u32,
    log_buf: u64,
    kern_version: u32,
    prog_flags: u32,
    prog_name: [u8; 16],
    prog_ifindex: u32,
    expected_attach_type: u32,
}

#[repr(C)]
#[derive(Default)]
struct Elem {
    map_fd: u32,
    pad: u32,
    key: u64,
    value: u64,
    flags: u64,
}

fn bpf<T>(cmd: libc::c_long, attr: &mut T) -> io::Result<i64> {
    // SAFETY: `attr` is a live repr(C) prefix of `union bpf_attr` for `cmd`, whose pointers
    // point at buffers kept alive by the caller for the call.
    let r = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            cmd,
            (attr as *mut T).cast::<libc::c_void>(),
            std::mem::size_of::<T>() as libc::c_uint,
        )
    };
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r)
    }
}

fn owned(fd: i64) -> OwnedFd {
    // SAFETY: the kernel just returned this descriptor to us and nothing else owns it.
    unsafe { OwnedFd::from_raw_fd(fd as i32) }
}

/// One BPF instruction.
fn insn(code: u8, dst: u8, src: u8, off: i16, imm: i32) -> [u8; 8] {
    let mut b = [0u8; 8];
    b[0] = code;
    b[1] = (src << 4) | dst;
    b[2..4].copy_from_slice(&off.to_le_bytes());
    b[4..8].copy_from_slice(&imm.to_le_bytes());
    b
}

/// The program, with `map` as the socket array.
fn program(map: i32) -> Vec<u8> {
    // Opcodes (include/uapi/linux/bpf_common.h, bpf.h).
    const MOV64_X: u8 = 0xbf;
    const MOV64_K: u8 = 0xb7;
    const ADD64_K: u8 = 0x07;
    const LSH64_K: u8 = 0x67;
    const RSH64_K: u8 = 0x77;
    const OR64_X: u8 = 0x4f;
    const LDX_B: u8 = 0x71;
    const STX_W: u8 = 0x63;
    const JNE_K: u8 = 0x55;
    const CALL: u8 = 0x85;
    const EXIT: u8 = 0x95;
    const LD_IMM64: u8 = 0x18;
    const PSEUDO_MAP_FD: u8 = 1;
    let (r0, r1, r2, r3, r4, r6, r7, r8, fp) = (0, 1, 2, 3, 4, 6, 7, 8, 10);
    let p = [
        insn(MOV64_X, r6, r1, 0, 0), // r6 = ctx
        // bpf_skb_load_bytes(ctx, 12, fp-4, 4): the BTH's bytes 4..8 (reserved, dest QPN);
        // the data starts at the UDP header.
        insn(MOV64_K, r2, 0, 0, 8 + 4),
        insn(MOV64_X, r3, fp, 0, 0),
        insn(ADD64_K, r3, 0, 0, -4),
        insn(MOV64_K, r4, 0, 0, 4),
        insn(CALL, 0, 0, 0, FUNC_SKB_LOAD_BYTES),
        insn(JNE_K, r0, 0, 13, 0), // short datagram: let the hash choose
        // slot = QPN >> 12 = byte5 << 4 | byte6 >> 4
        insn(LDX_B, r7, fp, -3, 0),
        insn(LSH64_K, r7, 0, 0, 4),
        insn(LDX_B, r8, fp, -2, 0),
        insn(RSH64_K, r8, 0, 0, 4),
        insn(OR64_X, r7, r8, 0, 0),
        insn(STX_W, fp, r7, -8, 0),
        // bpf_sk_select_reuseport(ctx, map, &slot, 0); an empty slot leaves the choice to
        // the hash.
        insn(MOV64_X, r1, r6, 0, 0),
        insn(LD_IMM64, r2, PSEUDO_MAP_FD, 0, map),
        insn(0, 0, 0, 0, 0),
        insn(MOV64_X, r3, fp, 0, 0),
        insn(ADD64_K, r3, 0, 0, -8),
        insn(MOV64_K, r4, 0, 0, 0),
        insn(CALL, 0, 0, 0, FUNC_SK_SELECT_REUSEPORT),
        insn(MOV64_K, r0, 0, 0, 1), // SK_PASS
        insn(EXIT, 0, 0, 0, 0),
    ];
    p.concat()
}

impl Steering {
    /// Loads the program and creates its map (needs `CAP_BPF` or root).
    pub fn create() -> io::Result<Self> {
        let mut m = MapCreate {
            map_type: MAP_TYPE_REUSEPORT_SOCKARRAY,
            key_size: 4,
            value_size: 8,
            max_entries: SLOTS,
            map_flags: 0,
        };
        let map = owned(bpf(BPF_MAP_CREATE, &mut m)?);
        let code = program(map.as_raw_fd());
        let license = c"Dual MIT/GPL";
        let mut log = vec![0u8; 4096];
        let mut name = [0u8; 16];
        name[..10].copy_from_slice(b"roce_steer");
        let mut a = ProgLoad {
            prog_type: PROG_TYPE_SK_REUSEPORT,
            insn_cnt: (code.len() / 8) as u32,
            insns: code.as_ptr() as u64,
            license: license.as_ptr() as u64,
            log_level: 1,
            log_size: log.len() as u32,
            log_buf: log.as_mut_ptr() as u64,
            prog_name: name,
            expected_attach_type: ATTACH_SK_REUSEPORT_SELECT,
            ..Default::default()
        };
        let prog = match bpf(BPF_PROG_LOAD, &mut a) {
            Ok(fd) => owned(fd),
            Err(e) => {
                let end = log.iter().position(|&b| b == 0).unwrap_or(log.len());
                return Err(io::Error::new(
                    e.kind(),
                    format!(
                        "loading the RoCEv2 steering program: {e}: {}",
                        String::from_utf8_lossy(&log[..end]).trim()
                    ),
                ));
            }
        };
        Ok(Self { prog, map })
    }

    /// Steering from descriptors someone handed over (smcd's, through its control socket).
    pub fn from_fds(prog: OwnedFd, map: OwnedFd) -> Self {
        Self { prog, map }
    }

    /// Another handle on the same program and map.
    pub fn try_clone(&self) -> io::Result<Self> {
        Ok(Self {
            prog: self.prog.try_clone()?,
            map: self.map.try_clone()?,
        })
    }

    /// The program's descriptor.
    pub fn prog(&self) -> BorrowedFd<'_> {
        self.prog.as_fd()
    }

    /// The map's descriptor.
    pub fn map(&self) -> BorrowedFd<'_> {
        self.map.as_fd()
    }

    /// Puts a bound `SO_REUSEPORT` socket into a free slot, starting the search at `hint`,
    /// and makes the group run the program. Returns the slot.
    pub(super) fn join(&self, sock: BorrowedFd<'_>, hint: u32) -> io::Result<u32> {
        let fd = sock.as_raw_fd() as u64;
        let mut slot = None;
        for i in 0..SLOTS {
            // Slot 0 would give QPNs 0 and 1, which mean the special QPs.
            let s = (hint + i) % SLOTS;
            if s == 0 {
                continue;
            }
            let key = s;
            let mut a = Elem {
                map_fd: self.map.as_raw_fd() as u32,
                key: (&key as *const u32) as u64,
                value: (&fd as *const u64) as u64,
                flags: BPF_NOEXIST,
                ..Default::default()
            };
            match bpf(BPF_MAP_UPDATE_ELEM, &mut a) {
                Ok(_) => {
                    slot = Some(s);
                    break;
                }
                Err(e) if e.raw_os_error() == Some(libc::EEXIST) => continue,
                Err(e) => return Err(e),
            }
        }
        let slot =
            slot.ok_or_else(|| io::Error::new(io::ErrorKind::AddrInUse, "no free steering slot"))?;
        let prog = self.prog.as_raw_fd();
        // SAFETY: setsockopt with a pointer to an int of the size given, on an open socket.
        let r = unsafe {
            libc::setsockopt(
                sock.as_raw_fd(),
                SOL_SOCKET,
                SO_ATTACH_REUSEPORT_EBPF,
                (&prog as *const i32).cast(),
                std::mem::size_of::<i32>() as libc::socklen_t,
            )
        };
        if r != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(slot)
    }
}
