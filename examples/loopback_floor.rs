//! The machine's floor for the `fanout` scenario: what it costs the kernel
//! alone to move one small message over one loopback TCP connection, with
//! no WebSocket, no JSON, no async runtime and no server logic.
//!
//! One thread writes a 120-byte message (about the size of a `fanout`
//! frame) to each of N connections in turn, paced to a total rate; another
//! thread waits in `epoll_wait` and reads whatever is ready. Both report
//! their CPU time per delivered message. Whatever a real server and load
//! generator spend on top of these two numbers is their own work; a target
//! that needs more than the machine's cores at this floor cannot be met on
//! it by any server.
//!
//! With a fifth argument B > 0 the writer does not call `write` per
//! message: it queues B sends (one per connection) on an io_uring and
//! submits them with one system call. That measures what is left of a
//! delivery's kernel cost once the system call per write is gone (the
//! TCP send and loopback receive paths stay): the floor for any server
//! that batches sends to many sockets (fan-out CPU).
//!
//! ```sh
//! cargo run --release --example loopback_floor -- 5000 1000000 10 [1 [64]]
//! #                          connections ^  rate/s ^   ^ seconds  ^ busy reader
//! #                                                      io_uring batch ^
//! ```

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

const MESSAGE: usize = 120;

/// CPU time (user + system) of the calling thread.
fn thread_cpu() -> Duration {
    // SAFETY: getrusage fills the struct we pass.
    let mut u: libc::rusage = unsafe { std::mem::zeroed() };
    unsafe { libc::getrusage(libc::RUSAGE_THREAD, &mut u) };
    let tv = |t: libc::timeval| Duration::new(t.tv_sec as u64, t.tv_usec as u32 * 1000);
    tv(u.ru_utime) + tv(u.ru_stime)
}

fn arg(i: usize, default: u64) -> u64 {
    std::env::args()
        .nth(i)
        .map(|a| a.parse().expect("numeric argument"))
        .unwrap_or(default)
}

fn main() {
    let n = arg(1, 5000) as usize;
    let rate = arg(2, 1_000_000);
    let secs = arg(3, 10);
    // 1: the reader never sleeps (epoll_wait with a zero timeout), so no
    // write has to wake it: the writer's figure is then the bare send path.
    let busy = arg(4, 0) == 1;

    let listener = TcpListener::bind("127.0.0.1:0").expect("bind loopback");
    let addr = listener.local_addr().unwrap();
    let mut writers = Vec::with_capacity(n);
    let mut readers = Vec::with_capacity(n);
    for _ in 0..n {
        let w = TcpStream::connect(addr).expect("connect (raise ulimit -n?)");
        w.set_nodelay(true).unwrap();
        let (r, _) = listener.accept().unwrap();
        r.set_nonblocking(true).unwrap();
        writers.push(w);
        readers.push(r);
    }

    let stop = Arc::new(AtomicBool::new(false));
    let received = Arc::new(AtomicU64::new(0));

    let reader = {
        let stop = stop.clone();
        let received = received.clone();
        std::thread::spawn(move || {
            // SAFETY: plain epoll calls on descriptors we own.
            let ep = unsafe { libc::epoll_create1(0) };
            for (i, r) in readers.iter().enumerate() {
                let mut ev = libc::epoll_event {
                    events: libc::EPOLLIN as u32,
                    u64: i as u64,
                };
                unsafe { libc::epoll_ctl(ep, libc::EPOLL_CTL_ADD, r.as_raw_fd(), &mut ev) };
            }
            let mut events = vec![libc::epoll_event { events: 0, u64: 0 }; 1024];
            let mut buf = vec![0u8; 64 * 1024];
            let (mut bytes, mut reads) = (0u64, 0u64);
            let cpu0 = thread_cpu();
            while !stop.load(Ordering::Relaxed) {
                let wait = if busy { 0 } else { 100 };
                let k = unsafe { libc::epoll_wait(ep, events.as_mut_ptr(), 1024, wait) };
                for ev in events.iter().take(k.max(0) as usize) {
                    let mut r = &readers[ev.u64 as usize];
                    while let Ok(got) = r.read(&mut buf) {
                        if got == 0 {
                            break;
                        }
                        bytes += got as u64;
                        reads += 1;
                    }
                }
                received.store(bytes / MESSAGE as u64, Ordering::Relaxed);
            }
            (thread_cpu() - cpu0, reads)
        })
    };

    let msg = [b'x'; MESSAGE];
    let interval = Duration::from_secs_f64(1.0 / rate as f64);
    let start = Instant::now();
    let cpu0 = thread_cpu();
    let total = rate * secs;
    let mut sent = 0u64;
    let batch = arg(5, 0) as usize;
    if batch == 0 {
        'outer: loop {
            for w in writers.iter_mut() {
                if sent == total {
                    break 'outer;
                }
                // Paced by the schedule; sleeping only when ahead by > 1 ms
                // keeps the writer from spinning or sleeping per message.
                let due = start + interval.mul_f64(sent as f64);
                let now = Instant::now();
                if due > now + Duration::from_millis(1) {
                    std::thread::sleep(due - now);
                }
                w.write_all(&msg).expect("write");
                sent += 1;
            }
        }
    } else {
        sent = uring_writes(&writers, &msg, batch, total, |sent| {
            let due = start + interval.mul_f64(sent as f64);
            let now = Instant::now();
            if due > now + Duration::from_millis(1) {
                std::thread::sleep(due - now);
            }
        });
    }
    let write_cpu = thread_cpu() - cpu0;
    let write_wall = start.elapsed();
    while received.load(Ordering::Relaxed) < sent && start.elapsed() < write_wall * 2 {
        std::thread::sleep(Duration::from_millis(10));
    }
    stop.store(true, Ordering::Relaxed);
    let (read_cpu, reads) = reader.join().unwrap();
    let got = received.load(Ordering::Relaxed);
    let per = |d: Duration| d.as_secs_f64() * 1e6 / got.max(1) as f64;
    println!("connections            {n}");
    println!(
        "messages sent          {sent} in {:.2} s ({:.0}/s asked {rate}/s)",
        write_wall.as_secs_f64(),
        sent as f64 / write_wall.as_secs_f64()
    );
    println!(
        "messages received      {got} in {reads} reads ({:.2} messages per read)",
        got as f64 / reads.max(1) as f64
    );
    println!(
        "writer CPU             {:.2} s = {:.2} us per message",
        write_cpu.as_secs_f64(),
        per(write_cpu)
    );
    println!(
        "reader CPU             {:.2} s = {:.2} us per message",
        read_cpu.as_secs_f64(),
        per(read_cpu)
    );
    println!(
        "cores needed at {rate}/s  {:.2} (writer + reader)",
        (per(write_cpu) + per(read_cpu)) * rate as f64 / 1e6
    );
}

/// Send `msg` to the connections in turn, `batch` sends per `io_uring_enter`
/// (one submission of `batch` SQEs, waiting for their completions), until
/// `total` are sent; `pace(sent)` runs before each batch. Returns how many
/// were sent. A short send is a failure of the measurement, not handled.
fn uring_writes(
    writers: &[TcpStream],
    msg: &[u8],
    batch: usize,
    total: u64,
    mut pace: impl FnMut(u64),
) -> u64 {
    use io_uring::{opcode, types, IoUring};
    let mut ring = IoUring::new(batch.next_power_of_two() as u32).expect("io_uring");
    let mut sent = 0u64;
    let mut next = 0usize;
    while sent < total {
        pace(sent);
        let k = batch.min((total - sent) as usize);
        {
            let mut sq = ring.submission();
            for _ in 0..k {
                let fd = types::Fd(writers[next].as_raw_fd());
                next = (next + 1) % writers.len();
                let e = opcode::Send::new(fd, msg.as_ptr(), msg.len() as u32)
                    .build()
                    .user_data(0);
                // SAFETY: `msg` outlives the submission (we wait for every
                // completion below before returning or reusing the ring).
                unsafe { sq.push(&e).expect("submission queue full") };
            }
        }
        ring.submit_and_wait(k).expect("io_uring_enter");
        let mut done = 0;
        for cqe in ring.completion() {
            assert_eq!(cqe.result(), msg.len() as i32, "short or failed send");
            done += 1;
        }
        assert_eq!(done, k, "completions");
        sent += k as u64;
    }
    sent
}
