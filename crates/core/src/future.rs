//! The boxed future the core's async interfaces return (broker, history,
//! sessions, observers): on the ground floor, so each of them can name it
//! without importing another.

use std::future::Future;
use std::pin::Pin;

pub type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;
