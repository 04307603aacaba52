//! `smc-cat`: netcat over SMC. Standard input goes to the connection, the connection to
//! standard output. At the end of standard input the write side is shut down (the peer reads
//! end of stream) and `smc-cat` keeps reading until the peer closes; a clean end of stream
//! exits 0.

use anyhow::Context;
use clap::Parser;
use smcd_engine::{Mode, SmcListener, SmcStream};
use std::io::{self, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream, ToSocketAddrs};

#[derive(Debug, Parser)]
// clap names the program after the package: `--version` printed `smcd-engine 0.1.0` while the
// binary lived there, and still does.
#[command(
    name = "smcd-engine",
    version,
    about = "netcat over SMC-D (falls back to TCP like any SMC socket)"
)]
struct Args {
    /// Listen on [ADDR:]PORT instead of connecting.
    #[arg(short = 'l', long = "listen")]
    listen: bool,
    /// With -l: keep accepting connections one after another (standard input is ignored).
    #[arg(short = 'k', long = "keep-open", requires = "listen")]
    keep: bool,
    /// Plain TCP only.
    #[arg(long)]
    tcp: bool,
    /// Print to stderr what each connection became.
    #[arg(short = 'v', long = "verbose")]
    verbose: bool,
    /// HOST:PORT to connect to, or [ADDR:]PORT to listen on.
    target: String,
}

enum Conn {
    Smc(SmcStream),
    Tcp(TcpStream),
}

impl Conn {
    fn reader(&self) -> anyhow::Result<Box<dyn Read + Send>> {
        Ok(match self {
            Conn::Smc(s) => Box::new(s.try_clone()?),
            Conn::Tcp(s) => Box::new(s.try_clone()?),
        })
    }
    fn writer(&self) -> anyhow::Result<Box<dyn Write + Send>> {
        Ok(match self {
            Conn::Smc(s) => Box::new(s.try_clone()?),
            Conn::Tcp(s) => Box::new(s.try_clone()?),
        })
    }
    fn shutdown_write(&self) {
        let _ = match self {
            Conn::Smc(s) => s.shutdown(Shutdown::Write),
            Conn::Tcp(s) => s.shutdown(Shutdown::Write),
        };
    }
    fn describe(&self) -> String {
        match self {
            Conn::Smc(s) => match s.mode() {
                Mode::SmcD(_) => format!("{}", s.mode()),
                Mode::Tcp(fb) => format!(
                    "TCP (fallback {:#010x} {}{})",
                    fb.local.0,
                    fb.local,
                    if fb.peer.0 != 0 {
                        format!(", peer {:#010x} {}", fb.peer.0, fb.peer)
                    } else {
                        String::new()
                    }
                ),
            },
            Conn::Tcp(_) => "TCP (--tcp)".to_string(),
        }
    }
}

fn listen_addr(target: &str) -> anyhow::Result<SocketAddr> {
    if let Ok(port) = target.parse::<u16>() {
        return Ok(SocketAddr::from(([0, 0, 0, 0], port)));
    }
    let t = target.strip_prefix(':').map(|p| format!("0.0.0.0:{p}"));
    t.as_deref()
        .unwrap_or(target)
        .to_socket_addrs()?
        .next()
        .with_context(|| format!("cannot resolve {target}"))
}

/// Copies the connection to stdout until end of stream; returns the bytes copied.
fn drain_to_stdout(conn: &Conn) -> io::Result<u64> {
    let mut r = conn.reader().map_err(io::Error::other)?;
    let stdout = io::stdout();
    let mut out = stdout.lock();
    let n = io::copy(&mut r, &mut out)?;
    out.flush()?;
    Ok(n)
}

fn serve(conn: Conn, forward_stdin: bool, verbose: bool, peer: &str) -> anyhow::Result<()> {
    if verbose {
        eprintln!("smc-cat: {peer}: {}", conn.describe());
    }
    let pump = if forward_stdin {
        let mut w = conn.writer()?;
        let conn_for_shutdown = match &conn {
            Conn::Smc(s) => Conn::Smc(s.try_clone()?),
            Conn::Tcp(s) => Conn::Tcp(s.try_clone()?),
        };
        Some(std::thread::spawn(move || -> io::Result<()> {
            let stdin = io::stdin();
            let mut input = stdin.lock();
            let r = io::copy(&mut input, &mut w).map(|_| ());
            let _ = w.flush();
            conn_for_shutdown.shutdown_write();
            r
        }))
    } else {
        conn.shutdown_write();
        None
    };
    let got = drain_to_stdout(&conn).context("reading from the connection")?;
    if verbose {
        eprintln!("smc-cat: {peer}: end of stream after {got} bytes");
    }
    if let Some(p) = pump {
        // The peer is done writing; finish sending standard input (it may still be writing
        // into a half-closed connection), so nothing we read from it is cut off.
        match p.join() {
            Ok(Err(e)) if e.kind() != io::ErrorKind::BrokenPipe => {
                return Err(e).context("writing to the connection");
            }
            _ => {}
        }
    }
    // The last handle goes here: an SMC connection sends its close before the process ends.
    drop(conn);
    Ok(())
}

/// The end of one served connection: with `-k` a failed one (a peer that died, a reset) is
/// reported and the listener goes on, as `nc -k` does; without it the error is the exit.
fn served(r: anyhow::Result<()>, keep: bool, peer: &SocketAddr) -> anyhow::Result<()> {
    match r {
        Err(e) if keep => {
            eprintln!("smc-cat: {peer}: {e:#}");
            Ok(())
        }
        r => r,
    }
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    if args.listen {
        let addr = listen_addr(&args.target)?;
        if args.tcp {
            let l = TcpListener::bind(addr).with_context(|| format!("bind {addr}"))?;
            loop {
                let (s, peer) = l.accept()?;
                served(
                    serve(Conn::Tcp(s), !args.keep, args.verbose, &peer.to_string()),
                    args.keep,
                    &peer,
                )?;
                if !args.keep {
                    return Ok(());
                }
            }
        }
        let l = SmcListener::bind(addr).with_context(|| format!("bind {addr}"))?;
        if args.verbose {
            eprintln!("smc-cat: listening on {}", l.local_addr()?);
        }
        loop {
            let (s, peer) = l.accept()?;
            served(
                serve(Conn::Smc(s), !args.keep, args.verbose, &peer.to_string()),
                args.keep,
                &peer,
            )?;
            if !args.keep {
                return Ok(());
            }
        }
    }
    let conn = if args.tcp {
        Conn::Tcp(
            TcpStream::connect(&args.target).with_context(|| format!("connect {}", args.target))?,
        )
    } else {
        Conn::Smc(
            SmcStream::connect(&args.target).with_context(|| format!("connect {}", args.target))?,
        )
    };
    serve(conn, true, args.verbose, &args.target)?;
    // Standard input may still be open (e.g. a terminal): the peer is done, so are we.
    std::process::exit(0);
}
