//! A tokio echo server and tokio clients over SMC streams, driven by `tokio::io::unix::AsyncFd`
//! on their readiness descriptors: what an async adapter does, in one file.
//!
//! ```sh
//! smcd --socket /tmp/smcd.sock &
//! SMCD_SOCKET=/tmp/smcd.sock cargo run -p smcd-engine --example tokio_echo -- 8 1000
//! SMCD_SOCKET=/tmp/smcd.sock cargo run -p smcd-engine --example tokio_echo -- 8 1000 mt
//! ```
//!
//! tokio registers every descriptor edge-triggered (`EPOLLET`) and forgets a readiness only
//! when a call through `try_io` returns `WouldBlock`: exactly the contract of
//! [`SmcStream::readiness_fd`], so nothing here knows it is not a TCP socket.
//!
//! - The accept loop waits on the (non-blocking) listener's readiness descriptor for readable
//!   and accepts until `WouldBlock`.
//! - One task per connection echoes: it waits readable, reads, waits writable, writes back.
//! - Each client connects without blocking ([`SmcStream::connect_nonblocking_with`]): it waits
//!   for the [`SmcConnecting`]'s descriptor to become readable or writable, as
//!   [`SmcConnecting::wants_read`] says, until [`SmcConnecting::try_finish`] gives the stream.
//!   Then one task writes its messages while another reads the echoes, on one `AsyncFd`.
//!   Every 25th message is larger than a DMB, so writers on both sides find the ring full and
//!   wait for writable; the others are small.
//!
//! Prints what each connection became, how often a read or a write returned `WouldBlock`, and
//! "all echoes matched"; exits non-zero otherwise. The third argument `mt` runs it on a
//! multi-thread runtime (two workers) instead of a current-thread one.

use smcd_engine::{Engine, SmcConnecting, SmcListener, SmcStream};
use std::io::{self, ErrorKind, Read, Write};
use std::net::SocketAddr;
use std::os::fd::{AsFd, OwnedFd};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;
use tokio::io::Interest;
use tokio::io::unix::AsyncFd;

/// How long the whole run may take before it gives up (a lost wake-up would hang it).
const RUN_LIMIT: Duration = Duration::from_secs(180);

fn main() -> io::Result<()> {
    let mut args = std::env::args().skip(1);
    let clients: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(4);
    let messages: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(1000);
    if args.next().as_deref() == Some("mt") {
        run_multi_thread(clients, messages)
    } else {
        run(clients, messages)
    }
}

/// The server and `clients` clients sending `messages` messages each, on a current-thread
/// runtime (smc-tools' `tests/tokio_echo.rs` compiles this file in and calls it).
pub fn run(clients: usize, messages: usize) -> io::Result<()> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    rt.block_on(echo_and_check(clients, messages))
}

/// [`run`] on a multi-thread runtime with two workers.
pub fn run_multi_thread(clients: usize, messages: usize) -> io::Result<()> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    rt.block_on(echo_and_check(clients, messages))
}

/// How often calls found nothing to do (and so cleared the readiness they could not use).
#[derive(Debug, Default)]
struct Stats {
    read_would_block: AtomicUsize,
    write_would_block: AtomicUsize,
}

/// Message `m` of client `id`: mostly short lines; every 25th one larger than a 64 KiB DMB.
fn message(id: usize, m: usize) -> Vec<u8> {
    let head = format!("client {id} message {m} ");
    let len = if m % 25 == 24 {
        96 * 1024 + (id * 7919 + m * 131) % 65536
    } else {
        16 + (id * 11 + m * 37) % 240
    };
    let len = len.max(head.len() + 1);
    let mut v = Vec::with_capacity(len);
    v.extend_from_slice(head.as_bytes());
    while v.len() < len - 1 {
        v.push(b'a' + ((v.len() + m) % 26) as u8);
    }
    v.push(b'\n');
    v
}

/// Registers a stream with the runtime: non-blocking, its readiness descriptor, both
/// directions.
fn register(stream: SmcStream) -> io::Result<AsyncFd<SmcStream>> {
    stream.set_nonblocking(true)?;
    // Creates the descriptor (and reports it if it cannot be made) before `as_raw_fd` is asked.
    stream.readiness_fd()?;
    // SAFETY: the readiness descriptor of a stream is made once and lives as long as the
    // connection, which the `AsyncFd` owns; `as_raw_fd` returns it every time.
    let fd = unsafe {
        AsyncFd::register_with_interest(stream, Interest::READABLE | Interest::WRITABLE)
    }?;
    Ok(fd)
}

/// Reads what is there, waiting for readable first; 0 at end of stream.
async fn read_some(fd: &AsyncFd<SmcStream>, buf: &mut [u8], stats: &Stats) -> io::Result<usize> {
    loop {
        let mut guard = fd.readable().await?;
        match guard.try_io(|s| {
            let mut r: &SmcStream = s.get_ref();
            r.read(buf)
        }) {
            Ok(Err(e)) if e.kind() == ErrorKind::Interrupted => {}
            Ok(r) => return r,
            // `WouldBlock`: tokio forgot the readiness; wait for the next edge.
            Err(_would_block) => {
                stats.read_would_block.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
}

/// Writes all of `buf`, waiting for writable whenever the peer's ring is full.
async fn write_all(fd: &AsyncFd<SmcStream>, mut buf: &[u8], stats: &Stats) -> io::Result<()> {
    while !buf.is_empty() {
        let mut guard = fd.writable().await?;
        match guard.try_io(|s| {
            let mut w: &SmcStream = s.get_ref();
            w.write(buf)
        }) {
            Ok(Ok(0)) => return Err(ErrorKind::WriteZero.into()),
            Ok(Ok(n)) => buf = &buf[n..],
            Ok(Err(e)) if e.kind() == ErrorKind::Interrupted => {}
            Ok(Err(e)) => return Err(e),
            Err(_would_block) => {
                stats.write_would_block.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
    Ok(())
}

/// Fills `buf` exactly; end of stream before that is an error.
async fn read_exact(fd: &AsyncFd<SmcStream>, mut buf: &mut [u8], stats: &Stats) -> io::Result<()> {
    while !buf.is_empty() {
        match read_some(fd, buf, stats).await? {
            0 => return Err(ErrorKind::UnexpectedEof.into()),
            n => buf = &mut buf[n..],
        }
    }
    Ok(())
}

/// One connection of the server: echo until end of stream, then close.
async fn serve(stream: SmcStream, stats: Arc<Stats>) -> io::Result<bool> {
    let smc = stream.is_smc();
    let fd = register(stream)?;
    let mut buf = vec![0u8; 32 * 1024];
    loop {
        let n = read_some(&fd, &mut buf, &stats).await?;
        if n == 0 {
            return Ok(smc);
        }
        write_all(&fd, &buf[..n], &stats).await?;
    }
}

/// Connects without blocking: waits on the connect's descriptor for what it says, until the
/// stream is there (SMC-D or TCP) or the connect fails.
async fn connect(addr: SocketAddr) -> io::Result<SmcStream> {
    let mut connecting: SmcConnecting =
        SmcStream::connect_nonblocking_with(Engine::global(), addr)?;
    // The runtime waits on a duplicate of the connect's socket, not on the `SmcConnecting`:
    // `AsyncFd` asks its inner value for the descriptor again when it is dropped, and the
    // socket changes hands when the connect finishes (the stream takes it over; a failed
    // handshake closes it). A duplicate is the same socket for epoll and ours to close.
    let dup: OwnedFd = connecting.as_fd().try_clone_to_owned()?;
    // SAFETY: `dup` is owned by the `AsyncFd` and nobody else closes it.
    let waiter =
        unsafe { AsyncFd::register_with_interest(dup, Interest::READABLE | Interest::WRITABLE) }?;
    loop {
        if let Some(stream) = connecting.try_finish()? {
            // Deregisters and closes the duplicate; the stream has the socket.
            drop(waiter);
            return Ok(stream);
        }
        let wants_read = connecting.wants_read();
        let wait = async {
            let mut guard = if wants_read {
                waiter.readable().await?
            } else {
                waiter.writable().await?
            };
            // `try_finish` went as far as it could (to `EAGAIN`): only a new edge helps.
            // tokio clears only the readiness of the event we saw, never a newer one.
            guard.clear_ready();
            io::Result::Ok(())
        };
        match connecting.deadline() {
            // The handshake gives up at its deadline: `try_finish` then reports it.
            Some(d) => {
                if let Ok(r) = tokio::time::timeout_at(d.into(), wait).await {
                    r?;
                }
            }
            None => wait.await?,
        }
    }
}

/// One client: connect, then write all messages while another task reads the echoes;
/// returns whether it went over SMC-D and how many echoes matched.
async fn client(
    addr: SocketAddr,
    id: usize,
    messages: usize,
    stats: Arc<Stats>,
) -> io::Result<(bool, usize)> {
    let stream = connect(addr).await?;
    let smc = stream.is_smc();
    let fd = Arc::new(register(stream)?);
    let writer = {
        let (fd, stats) = (Arc::clone(&fd), Arc::clone(&stats));
        tokio::spawn(async move {
            for m in 0..messages {
                write_all(&fd, &message(id, m), &stats).await?;
            }
            // The server sees end of stream, finishes and closes.
            fd.get_ref().shutdown(std::net::Shutdown::Write)
        })
    };
    let mut echoed = 0;
    for m in 0..messages {
        let want = message(id, m);
        let mut back = vec![0u8; want.len()];
        read_exact(&fd, &mut back, &stats).await?;
        if back == want {
            echoed += 1;
        }
    }
    let mut extra = [0u8; 1];
    let end = read_some(&fd, &mut extra, &stats).await?;
    writer.await.map_err(io::Error::other)??;
    if end != 0 {
        return Err(io::Error::other("bytes after the last echo"));
    }
    Ok((smc, echoed))
}

async fn echo_and_check(clients: usize, messages: usize) -> io::Result<()> {
    let listener = SmcListener::bind_with(Engine::global(), "127.0.0.1:0")?;
    listener.set_nonblocking(true)?;
    let addr = listener.local_addr()?;
    listener.readiness_fd()?;
    // SAFETY: the listener's readiness descriptor is made once and lives as long as the
    // listener, which the `AsyncFd` owns; `as_raw_fd` returns it every time.
    let listener = unsafe { AsyncFd::register_with_interest(listener, Interest::READABLE) }?;
    let stats = Arc::new(Stats::default());

    let client_tasks: Vec<_> = (0..clients)
        .map(|id| tokio::spawn(client(addr, id, messages, Arc::clone(&stats))))
        .collect();

    let server = {
        let stats = Arc::clone(&stats);
        async move {
            let mut conns = Vec::new();
            while conns.len() < clients {
                let mut guard = listener.readable().await?;
                match guard.try_io(|l| l.get_ref().accept()) {
                    Ok(Ok((stream, _))) => {
                        conns.push(tokio::spawn(serve(stream, Arc::clone(&stats))));
                    }
                    Ok(Err(e)) if e.kind() == ErrorKind::Interrupted => {}
                    Ok(Err(e)) => return Err(e),
                    Err(_would_block) => {}
                }
            }
            let mut smc = 0;
            for c in conns {
                smc += usize::from(c.await.map_err(io::Error::other)??);
            }
            io::Result::Ok(smc)
        }
    };

    let all = async {
        let server_smc = server.await?;
        let mut results = Vec::new();
        for t in client_tasks {
            results.push(t.await.map_err(io::Error::other)??);
        }
        io::Result::Ok((server_smc, results))
    };
    let (server_smc, results) = tokio::time::timeout(RUN_LIMIT, all)
        .await
        .map_err(|_| io::Error::new(ErrorKind::TimedOut, "the echo run did not finish"))??;

    let mut all_ok = true;
    for (smc, echoed) in &results {
        println!(
            "client: {echoed} echoes of {messages} over {}",
            if *smc { "SMC-D" } else { "TCP" }
        );
        all_ok &= *echoed == messages;
    }
    println!("server: {server_smc} of {clients} connections over SMC-D");
    println!(
        "would block: {} reads, {} writes",
        stats.read_would_block.load(Ordering::Relaxed),
        stats.write_would_block.load(Ordering::Relaxed)
    );
    if all_ok {
        println!("all echoes matched");
        Ok(())
    } else {
        Err(io::Error::other("some echoes did not match"))
    }
}
