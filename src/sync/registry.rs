//! What a sync mode declares about itself ([`ModeSpec`]), and the macro that turns the registry's
//! lines (in `sync/mod.rs`) into `--sync`'s values ([`super::SyncKind`]) and the modes' option
//! groups ([`super::ModeOptions`]).
//!
//! A mode is one file in `src/sync/` holding `pub const MODE: ModeSpec` and its option group, plus
//! one registry line. Everything the layers above know of a mode comes from its declaration:
//! - the configuration: `--sync`'s values and their help, the option groups a run of the mode uses
//!   (explicit options of any other group are refused, naming the runs they apply to), the
//!   mode's validation rules, and the defaults it resolves (which the checkpoints' run identity
//!   hashes);
//! - the training loop: how the mode is built (for SGD, and for `--model lda`'s counts), whether
//!   its replicas differ, whether it keeps SAGA's gradient history.
//!
//! A declaration reads the run's configuration through a [`RunSpec`], which the configuration
//! layer builds, so `sync` never imports `config` (the layering of lib.rs).

use serde::{Deserialize, Serialize};

use super::{ModeOptions, SyncContext, SyncKind, SyncMode};
use crate::model::ModelKind;

/// One use of option groups: the further choices (config keys and values, all of which must
/// hold) under which a run of the mode uses the groups. Groups are clap `ArgGroup` ids: a mode's
/// own options struct (`AsapOptions`), or a group several modes share (`staleness_group`: a
/// struct of groups.rs, declared once, listed by each mode that reads it).
pub type Uses = (&'static [(&'static str, &'static str)], &'static [&'static str]);

/// What building a mode gives: the mode and what the metrics' start line records about it.
pub type Built = anyhow::Result<(Box<dyn SyncMode>, serde_json::Value)>;

/// Builds a mode for `--model lda`, whose replicas hold counts that must be summed exactly.
pub type BuildCounts = fn(&SyncContext, &RunSpec, &[f32]) -> anyhow::Result<Box<dyn SyncMode>>;

/// The part of a run's configuration that mode declarations read: every mode's options, and the
/// few general settings a mode's rules or construction depend on.
pub struct RunSpec<'a> {
    pub opts: &'a ModeOptions,
    pub model: ModelKind,
    /// `--lr` (bosen's AdaRevision servers use it as alpha).
    pub lr: f32,
    /// `--lr-schedule adarevision`.
    pub adarevision: bool,
    /// `--checkpoint-dir` given: checkpoints will be written.
    pub checkpoints: bool,
    /// `--emulate-bandwidth` given (or filled in by `--cluster`): every rank has a link rate.
    pub emulated_link: bool,
}

/// A mode's declaration.
#[derive(Clone, Copy)]
pub struct ModeSpec {
    /// The `--sync` value.
    pub name: &'static str,
    /// One line for `--sync`'s help.
    pub help: &'static str,
    /// The option groups a run of this mode uses (`("sync", name)` is implied in each).
    pub uses: &'static [Uses],
    /// Every round leaves all replicas equal (allreduce): evaluations need not score each rank's
    /// own replica, the averaged model stands for them.
    pub replicas_agree: bool,
    /// Its shard servers compute per-coordinate steps (`--lr-schedule adarevision` needs one).
    pub server_steps: bool,
    /// Its checkpoints resume at another rank count (`train::elastic`): every rank holds a whole
    /// replica, and its state is rebuilt from their average ([`SyncMode::averaged_on_resize`]),
    /// or from the model `resize_model` names.
    pub elastic: bool,
    /// At a resume on another rank count, the model every new rank starts from is this entry of
    /// the old ranks' mode state laid end to end in rank order (the parameter servers' shards:
    /// the servers' model is the truth, the replicas are caches of it), not the replicas'
    /// average (None).
    pub resize_model: Option<&'static str>,
    /// A lost rank need not end its run (`--on-rank-loss continue`, src/train/shrink.rs): every
    /// rank holds a whole replica and no rank holds state the others need (a coordinator, a
    /// parameter server's shard), so the survivors can be rebuilt as a run on fewer ranks.
    pub survives_rank_loss: bool,
    /// The mode paces its own sends with these options (a bandwidth budget): `--send-log` has
    /// something to record without `--emulate-bandwidth`.
    pub paces_sends: fn(&ModeOptions) -> bool,
    /// The run's steps keep SAGA's gradient history, which this mode applies
    /// ([`SyncMode::history`]): the optimizer of the run is SAGA.
    pub keeps_history: fn(&ModeOptions) -> bool,
    /// The mode's rules on its options (and on general ones, as they concern it): each error
    /// names the options to change.
    pub validate: fn(&RunSpec) -> anyhow::Result<()>,
    /// Fills in the defaults that depend on the mode, so that a default and the same value given
    /// explicitly are the same run (the checkpoints' run identity hashes the resolved options).
    pub resolve: fn(&mut ModeOptions),
    /// Fits a default that depends on the rounds of an epoch (train::plan::steps_per_epoch), once the
    /// shards are known; returns what it chose and why, for the start line, or None.
    pub fit_to_epoch: fn(&mut ModeOptions, u64) -> Option<String>,
    /// Builds the mode (collective over `ctx.comm`).
    pub build: fn(&SyncContext, &RunSpec, &[f32]) -> Built,
    /// Builds the mode for `--model lda`'s counts; None: the mode cannot carry them.
    pub build_counts: Option<BuildCounts>,
}

impl ModeSpec {
    /// A mode that uses no option group, adds no rule and no default, and has distinct replicas:
    /// a declaration names what differs with `ModeSpec { field: ..., ..ModeSpec::new(...) }`.
    pub const fn new(name: &'static str, help: &'static str, build: fn(&SyncContext, &RunSpec, &[f32]) -> Built) -> Self {
        ModeSpec {
            name,
            help,
            uses: &[],
            replicas_agree: false,
            server_steps: false,
            elastic: false,
            resize_model: None,
            survives_rank_loss: false,
            paces_sends: never,
            keeps_history: never,
            validate: no_rules,
            resolve: nothing_to_resolve,
            fit_to_epoch: nothing_to_fit,
            build,
            build_counts: None,
        }
    }
}

impl ModeSpec {
    /// Builds the mode for a run (collective over `ctx.comm`): the declaration's `build`, under
    /// the outer optimizer when the run asks for one (`--outer-optimizer`, a shared group that
    /// only the averaging modes list in `uses`, so other runs never reach here with it).
    pub fn build_run(&self, ctx: &SyncContext, run: &RunSpec, init: &[f32]) -> Built {
        let (mode, mut info) = (self.build)(ctx, run, init)?;
        // The outer options as resolved by the declaration (asap fills --outer-pseudo-gradient).
        let mut opts = run.opts.clone();
        (self.resolve)(&mut opts);
        let mode = super::outer::Outer::wrap(mode, &mut info, &opts.outer, init);
        Ok((mode, info))
    }
}

fn never(_: &ModeOptions) -> bool {
    false
}

fn no_rules(_: &RunSpec) -> anyhow::Result<()> {
    Ok(())
}

fn nothing_to_resolve(_: &mut ModeOptions) {}

fn nothing_to_fit(_: &mut ModeOptions, _: u64) -> Option<String> {
    None
}

/// Generates, from the registry's lines, the mode modules, [`SyncKind`] and [`ModeOptions`].
macro_rules! modes {
    (
        $( $variant:ident : $module:ident $({ $field:ident : $opts:ident })? ; )*
        @shared { $( $shared_field:ident : $shared_opts:ident ),* $(,)? }
    ) => {
        $( pub mod $module; )*

        /// `--sync`: how ranks exchange what they learned, one value per registry line (each
        /// named and described by its mode's declaration, [`ModeSpec`]).
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        pub enum SyncKind {
            $( $variant, )*
        }

        impl SyncKind {
            /// Every mode, in the registry's order.
            pub const ALL: &'static [SyncKind] = &[$( SyncKind::$variant, )*];

            /// The mode's declaration.
            pub fn spec(self) -> &'static ModeSpec {
                match self {
                    $( SyncKind::$variant => &$module::MODE, )*
                }
            }
        }

        /// Every mode's own option group, one field per registry line that names one, then the
        /// groups several modes share (`@shared`, declared in groups.rs); flattened into the
        /// configuration (flags, config-file keys and defaults come from the groups'
        /// declarations).
        #[derive(clap::Args, Clone, Debug, Default, PartialEq, serde::Serialize, serde::Deserialize)]
        #[serde(default)]
        #[group(skip)]
        pub struct ModeOptions {
            $($(
                #[command(flatten)]
                #[serde(flatten)]
                pub $field: $module::$opts,
            )?)*
            $(
                #[command(flatten)]
                #[serde(flatten)]
                pub $shared_field: groups::$shared_opts,
            )*
        }
    };
}

impl SyncKind {
    /// The mode whose `--sync` value is `name`.
    pub fn named(name: &str) -> Option<SyncKind> {
        SyncKind::ALL.iter().copied().find(|k| k.spec().name == name)
    }

    /// The `--sync` values of the modes for which `has` holds, as "a, b or c".
    pub fn names_where(has: impl Fn(&ModeSpec) -> bool) -> String {
        let names: Vec<&str> = SyncKind::ALL.iter().map(|k| k.spec()).filter(|s| has(s)).map(|s| s.name).collect();
        match names.split_last() {
            None => String::new(),
            Some((last, [])) => last.to_string(),
            Some((last, rest)) => format!("{} or {last}", rest.join(", ")),
        }
    }
}

impl clap::ValueEnum for SyncKind {
    fn value_variants<'a>() -> &'a [Self] {
        SyncKind::ALL
    }

    fn to_possible_value(&self) -> Option<clap::builder::PossibleValue> {
        Some(clap::builder::PossibleValue::new(self.spec().name).help(self.spec().help))
    }
}

impl Serialize for SyncKind {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.spec().name)
    }
}

impl<'de> Deserialize<'de> for SyncKind {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let name = String::deserialize(d)?;
        SyncKind::named(&name).ok_or_else(|| {
            let all: Vec<String> = SyncKind::ALL.iter().map(|k| format!("`{}`", k.spec().name)).collect();
            serde::de::Error::custom(format!("unknown variant `{name}`, expected one of {}", all.join(", ")))
        })
    }
}

impl std::fmt::Display for SyncKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.spec().name)
    }
}
