"""Every name privzo gives what it writes to MLflow and reads back: run and model-version tags, the params it
adds to the flattened spec, and artifact names (docs/design.md, "MLflow conventions"). The flows, `privzo
verify`, the UI check and the tests read them from here; tests/test_layering.py finds no other spelling of
them in the code. MLflow's own names (mlflow.note.content, mlflow.experimentKind) are MLflow's."""

# The guarantee, on a run and on its registered version. On a version, dp.epsilon/dp.guarantee are the
# model's (composed over every run that trained it) and dp.run_* the run's own spend.
DP_EPSILON = "dp.epsilon"
DP_DELTA = "dp.delta"
DP_GUARANTEE = "dp.guarantee"
DP_ACCOUNTANT = "dp.accountant"
DP_NEIGHBORING = "dp.neighboring"
DP_NOISE_MULTIPLIER = "dp.noise_multiplier"
DP_NOISE_SOURCE = "dp.noise_source"
DP_STEPS = "dp.steps"
DP_PRIVATE = "dp.private"
DP_LARGE_DELTA = "dp.large_delta"
DP_ZCDP_RHO = "dp.zcdp_rho"
DP_TARGET_EPSILON = "dp.target_epsilon"
DP_BUDGET_LEFT = "dp.budget_left"
DP_MODEL_EPSILON = "dp.model_epsilon"
DP_MODEL_RUNS = "dp.model_runs"
DP_RUN_EPSILON = "dp.run_epsilon"
DP_RUN_GUARANTEE = "dp.run_guarantee"
DATA_FINGERPRINT = "data.fingerprint"  # keyed: flows/record/tracking.py, released_fingerprint

# What a run is and where its weights came from
PRIVZO_SPEC = "privzo.spec"
PRIVZO_ESTIMATOR = "privzo.estimator"
PRIVZO_KIND = "privzo.kind"  # audit, reproduce: runs that train no registered model
PRIVZO_INIT = "privzo.init"  # the registered version a run started from, or "seed"
PRIVZO_INIT_RUN_ID = "privzo.init_run_id"
PRIVZO_INIT_EPSILON = "privzo.init_epsilon"
PRIVZO_INIT_DATA_FINGERPRINT = "privzo.init_data_fingerprint"
PRIVZO_BLOCKS = "privzo.blocks"  # the window of data blocks a run read
PRIVZO_RESUMED_FROM_STEP = "privzo.resumed_from_step"
PRIVZO_DIRECTIONS_STREAM = "privzo.directions_stream"
PRIVZO_DIRECTIONS_VERSION = "privzo.directions_version"
PRIVZO_REGISTER = "privzo.register"  # weights | transcript, on the version
PRIVZO_LOAD = "privzo.load"  # in a transcript model's MLmodel metadata: what rebuilds its weights
PRIVZO_TRANSCRIPT_BYTES = "privzo.transcript_bytes"
PRIVZO_WEIGHTS_BYTES = "privzo.weights_bytes"

# An audit run's findings
AUDIT_CLAIMED_EPSILON = "audit.claimed_epsilon"
AUDIT_DELTA = "audit.delta"
AUDIT_EPSILON_LOWER = "audit.epsilon_lower"
AUDIT_WHITE_BOX_EPSILON_LOWER = "audit.white_box.epsilon_lower"
AUDIT_WHITE_BOX_GUESSES = "audit.white_box.guesses"
AUDIT_WHITE_BOX_CORRECT = "audit.white_box.correct"
AUDIT_BLACK_BOX_EPSILON_LOWER = "audit.black_box.epsilon_lower"
AUDIT_BLACK_BOX_GUESSES = "audit.black_box.guesses"
AUDIT_BLACK_BOX_CORRECT = "audit.black_box.correct"
AUDIT_CONFIDENCE = "audit.confidence"
AUDIT_CANARIES = "audit.canaries"
AUDIT_THREAT_MODELS = "audit.threat_models"
AUDIT_METHOD = "audit.method"
AUDIT_RUNS = "audit.runs"
AUDIT_PERSON_ROWS = "audit.person_rows"
AUDIT_EXCEEDS_CLAIM = "audit.exceeds_claim"
AUDIT_NOISE_SCALE = "audit.noise_scale"
AUDIT_ESTIMATOR = "audit.estimator"
AUDIT_NOISE_MULTIPLIER = "audit.noise_multiplier"
AUDIT_STEPS = "audit.steps"
AUDIT_BACKGROUND = "audit.background"
AUDIT_SHARE_AT_CLIP = "audit.share_at_clip"
AUDIT_SECONDS = "audit.seconds"

# Params beside the flattened spec: what the run derived from its data and machine
DERIVED_N_PUBLIC = "derived.n_public"
DERIVED_N_TEST = "derived.n_test"
DERIVED_N_PRIVATE = "derived.n_private"  # only where the private count is public (replace-one)
DERIVED_SAMPLING_RATE = "derived.sampling_rate"
DERIVED_DIMENSION = "derived.dimension"
DERIVED_DEVICE = "derived.device"

# Artifacts
SPEC_ARTIFACT = "spec.yaml"
DP_EVENT_ARTIFACT = "dp_event.json"
PRIVACY_REPORT_ARTIFACT = "privacy_report.md"
JOURNAL_ARTIFACT = "journal/journal.json"
MODEL_EVENT_ARTIFACT = "model_dp_event.json"  # the model's composed DpEvent, on the version's run
MODEL_BLOCK_EVENTS_ARTIFACT = "model_dp_events_by_block.json"
AUDIT_ARTIFACT = "audit.json"
AUDIT_REPORT_ARTIFACT = "audit_report.md"
AUDIT_CANARIES_ARTIFACT = "audit_canaries.csv"
MODEL_ARTIFACT = "model"

TUNE = "privzo.tune"  # a tune's runs: search (its parent), winner, rehearsal
TUNE_ROWS = "privzo.tune.rows"  # a rehearsal run's: which rows it read (public only)
TUNE_PICKED_BY = "privzo.tune.picked_by"  # a private stage's run: the rehearsal whose pick it trains or searches

# MLflow's own names (mlflow.utils.mlflow_tags where it has them; tests/test_layering.py holds them equal): this
# module imports nothing, so it spells them
MLFLOW_RUN_NOTE = "mlflow.note.content"  # what MLflow's UI shows as a run's description
MLFLOW_PARENT_RUN_ID = "mlflow.parentRunId"  # the UI nests a child run under its parent
# what kind of work an experiment holds (MLflow's UI reads it to open the training view)
MLFLOW_EXPERIMENT_KIND = "mlflow.experimentKind"
MLFLOW_SOURCE_NAME = "mlflow.source.name"  # the UI's Source: what ran (privzo's flow, by its module)
MLFLOW_SOURCE_TYPE = "mlflow.source.type"
MLFLOW_GIT_COMMIT = "mlflow.source.git.commit"  # the UI's Source: the code's version
MLFLOW_GIT_REPO_URL = "mlflow.source.git.repoURL"
MLFLOW_DATASET_CONTEXT = "mlflow.data.context"  # a dataset input's role: training
