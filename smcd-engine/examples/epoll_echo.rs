//! An epoll-driven echo server over non-blocking SMC streams, the way an event loop (mio,
//! tokio, a hand-written one) drives them.
//!
//! ```sh
//! smcd --socket /tmp/smcd.sock &
//! SMCD_SOCKET=/tmp/smcd.sock cargo run -p smcd-engine --example epoll_echo -- 8 1000
//! ```
//!
//! One thread runs the loop: the listener's readiness descriptor tells when `accept` has a
//! connection; each stream's readiness descriptor ([`SmcStream::readiness_fd`]) is readable
//! and writable as a TCP socket's would be, edge-triggered here: the loop reads and writes
//! until they return `WouldBlock`. Client threads (blocking streams) send messages and
//! check the echoes. Prints what the connections became and exits 0 when all echoes match.

use rustix::event::epoll;
use smcd_engine::{SmcListener, SmcStream};
use std::collections::HashMap;
use std::io::{ErrorKind, Read, Write};

struct Conn {
    stream: SmcStream,
    pending: Vec<u8>,
}

/// Reads what is there and writes back what it can; false when the connection is done.
fn service(c: &mut Conn) -> bool {
    let mut buf = [0u8; 16 * 1024];
    let mut open = true;
    loop {
        match (&c.stream).read(&mut buf) {
            Ok(0) => {
                open = false;
                break;
            }
            Ok(n) => c.pending.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == ErrorKind::WouldBlock => break,
            Err(e) if e.kind() == ErrorKind::Interrupted => continue,
            Err(_) => return false,
        }
    }
    while !c.pending.is_empty() {
        match (&c.stream).write(&c.pending) {
            Ok(n) => {
                c.pending.drain(..n);
            }
            Err(e) if e.kind() == ErrorKind::WouldBlock => break,
            Err(e) if e.kind() == ErrorKind::Interrupted => continue,
            Err(_) => return false,
        }
    }
    open || !c.pending.is_empty()
}

fn main() -> std::io::Result<()> {
    let mut args = std::env::args().skip(1);
    let clients: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(4);
    let messages: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(1000);
    run(clients, messages)
}

/// The loop and `clients` client threads sending `messages` messages each (smc-tools'
/// `tests/epoll.rs` compiles this file in and calls it).
pub fn run(clients: usize, messages: usize) -> std::io::Result<()> {
    let listener = SmcListener::bind("127.0.0.1:0")?;
    listener.set_nonblocking(true)?;
    let addr = listener.local_addr()?;
    let ep = epoll::create(epoll::CreateFlags::CLOEXEC)?;
    const LISTENER: u64 = u64::MAX;
    epoll::add(
        &ep,
        listener.readiness_fd()?,
        epoll::EventData::new_u64(LISTENER),
        epoll::EventFlags::IN,
    )?;

    let workers: Vec<_> = (0..clients)
        .map(|id| {
            std::thread::spawn(move || -> std::io::Result<(bool, usize)> {
                let s = SmcStream::connect(addr)?;
                let mut echoed = 0;
                for m in 0..messages {
                    let msg = format!("client {id} message {m}\n");
                    (&s).write_all(msg.as_bytes())?;
                    let mut back = vec![0u8; msg.len()];
                    (&s).read_exact(&mut back)?;
                    if back == msg.as_bytes() {
                        echoed += 1;
                    }
                }
                Ok((s.is_smc(), echoed))
            })
        })
        .collect();

    let mut conns: HashMap<u64, Conn> = HashMap::new();
    let mut next = 0u64;
    let mut done = 0;
    let mut events = Vec::with_capacity(64);
    while done < clients {
        events.clear();
        epoll::wait(&ep, rustix::buffer::spare_capacity(&mut events), None)?;
        for ev in &events {
            let token = ev.data.u64();
            if token == LISTENER {
                loop {
                    match listener.accept() {
                        Ok((stream, _)) => {
                            stream.set_nonblocking(true)?;
                            epoll::add(
                                &ep,
                                stream.readiness_fd()?,
                                epoll::EventData::new_u64(next),
                                epoll::EventFlags::IN
                                    | epoll::EventFlags::OUT
                                    | epoll::EventFlags::ET,
                            )?;
                            conns.insert(
                                next,
                                Conn {
                                    stream,
                                    pending: Vec::new(),
                                },
                            );
                            next += 1;
                        }
                        Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                        Err(e) => return Err(e),
                    }
                }
                continue;
            }
            let Some(c) = conns.get_mut(&token) else {
                continue;
            };
            if !service(c) {
                let c = conns.remove(&token).expect("present");
                let _ = epoll::delete(&ep, c.stream.readiness_fd()?);
                done += 1;
            }
        }
    }
    let mut all_ok = true;
    for w in workers {
        let (smc, echoed) = w.join().expect("client thread")?;
        println!(
            "client: {} echoes of {messages} over {}",
            echoed,
            if smc { "SMC-D" } else { "TCP" }
        );
        all_ok &= echoed == messages;
    }
    if all_ok {
        println!("all echoes matched");
        Ok(())
    } else {
        Err(std::io::Error::other("some echoes did not match"))
    }
}
