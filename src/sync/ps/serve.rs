//! The serve loop of the parameter-server modes: a rank that waits keeps serving the others
//! (ssp, bosen, async, gaia), with one back-off and one timeout, judged past the limit by the
//! job's sign-of-life board ([`WaitDeadline`]).

use std::time::Duration;

use crate::comm::backoff::Backoff;
use crate::comm::deadline::WaitDeadline;

/// Serves (`serve`) until `done` holds: once first, then after each pause of `backoff`. A rank
/// that waits for a parameter server must keep serving the ranks that wait for it, or two ranks
/// waiting for each other would both stop. Past `limit` the job's sign-of-life board judges the
/// wait ([`WaitDeadline`], still serving meanwhile): it fails with `timed_out(state, waited,
/// verdict)`, where the state says what was missing and the verdict names only the ranks without
/// a sign of life (or says it cannot tell), and goes on while every rank lives (up to ten more
/// limits). Returns the time it waited (the mode counts it as waiting).
pub fn serve_until<S: ?Sized>(
    state: &mut S,
    limit: Duration,
    mut backoff: Backoff,
    mut serve: impl FnMut(&mut S) -> anyhow::Result<()>,
    done: impl Fn(&S) -> bool,
    timed_out: impl Fn(&S, Duration, &str) -> anyhow::Error,
) -> anyhow::Result<Duration> {
    let mut deadline = WaitDeadline::new(limit);
    serve(state)?;
    while !done(state) {
        let mut failed = None;
        let verdict = deadline.check(|| {
            if failed.is_none() {
                failed = serve(state).err();
            }
        });
        if let Some(e) = failed {
            return Err(e);
        }
        if let Some(why) = verdict.filter(|_| !done(state)) {
            return Err(timed_out(state, deadline.waited(), &why));
        }
        backoff.pause();
        serve(state)?;
    }
    Ok(deadline.waited())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn serves_until_done_and_names_what_is_missing_after_the_limit() {
        let mut served = 0u32;
        let waited = serve_until(
            &mut served,
            Duration::from_secs(5),
            Backoff::default(),
            |s| {
                *s += 1;
                Ok(())
            },
            |s| *s >= 3,
            |_, _, _| anyhow::anyhow!("never"),
        )
        .unwrap();
        assert_eq!(served, 3, "served once before the first check and once after each pause");
        assert!(waited < Duration::from_secs(5));
        let mut served = 0u32;
        // Past the limit, outside a training run (no sign-of-life board), it cannot tell who
        // holds the wait up and fails at once, with what the state says was missing.
        let err = serve_until(
            &mut served,
            Duration::from_millis(20),
            Backoff::default(),
            |s| {
                *s += 1;
                Ok(())
            },
            |_| false,
            |s, w, why| anyhow::anyhow!("waited {w:?} after {s} serves: {why}"),
        )
        .unwrap_err();
        assert!(err.to_string().starts_with("waited") && err.to_string().contains("cannot tell") && served > 1, "{err}");
        // A failing serve ends the wait with its error.
        let err = serve_until(
            &mut 0u32,
            Duration::from_secs(5),
            Backoff::default(),
            |_| anyhow::bail!("bad message"),
            |_| false,
            |_, _, _| anyhow::anyhow!("timeout"),
        );
        assert_eq!(err.unwrap_err().to_string(), "bad message");
    }
}
