// The hflow.builtin verifier (builtins and arithmetic on batch values,
// Builtins.h) and the layout attribute verifier on hand-written IR.
// RUN: hflow-opt %s -split-input-file -verify-diagnostics

// Well-formed: arithmetic with a scalar, scale_rhs, an estimator, kl.
%s = builtin.unrealized_conversion_cast to !hflow.batch<scores>
%v = builtin.unrealized_conversion_cast to !hflow.batch<values>
%l = builtin.unrealized_conversion_cast to !hflow.batch<logprobs>
%k = hflow.builtin "kl"(%l, %l) {args = {kind = "k3"}} : (!hflow.batch<logprobs>, !hflow.batch<logprobs>) -> !hflow.batch<kl>
%a = hflow.builtin "sub"(%s, %k) {scale_rhs = 0.1 : f64} : (!hflow.batch<scores>, !hflow.batch<kl>) -> !hflow.batch<scores>
%b = hflow.builtin "sub"(%a) {scalar = 1.0 : f64, scalar_lhs} : (!hflow.batch<scores>) -> !hflow.batch<scores>
%c = hflow.builtin "neg"(%b) : (!hflow.batch<scores>) -> !hflow.batch<scores>
%g:2 = hflow.builtin "gae"(%c, %v) {args = {gamma = 1.0 : f64, lam = 0.95 : f64}} : (!hflow.batch<scores>, !hflow.batch<values>) -> (!hflow.batch<advantages>, !hflow.batch<returns>)
%w = hflow.builtin "whiten"(%g#0) : (!hflow.batch<advantages>) -> !hflow.batch<advantages>
%cl = hflow.builtin "clip"(%s) {args = {max = 2 : i64, min = -1.5 : f64}} : (!hflow.batch<scores>) -> !hflow.batch<scores>
%cw = hflow.builtin "clip"(%w) {args = {max = 5.0 : f64}} : (!hflow.batch<advantages>) -> !hflow.batch<advantages>
%rn = hflow.builtin "running_norm"(%cl) {args = {epsilon = 1.0e-6 : f64}} : (!hflow.batch<scores>) -> !hflow.batch<scores>

// -----

%s = builtin.unrealized_conversion_cast to !hflow.batch<scores>
// expected-error @+1 {{'clip' needs a numeric 'min', 'max' or both}}
%x = hflow.builtin "clip"(%s) : (!hflow.batch<scores>) -> !hflow.batch<scores>

// -----

%s = builtin.unrealized_conversion_cast to !hflow.batch<scores>
// expected-error @+1 {{'clip' min 1 is greater than max -1}}
%x = hflow.builtin "clip"(%s) {args = {max = -1 : i64, min = 1.0 : f64}} : (!hflow.batch<scores>) -> !hflow.batch<scores>

// -----

%l = builtin.unrealized_conversion_cast to !hflow.batch<logprobs>
// expected-error @+1 {{'running_norm' input 1 must be scores, got logprobs}}
%x = hflow.builtin "running_norm"(%l) : (!hflow.batch<logprobs>) -> !hflow.batch<logprobs>

// -----

%s = builtin.unrealized_conversion_cast to !hflow.batch<scores>
// expected-error @+1 {{'whiten' must have a result}}
hflow.builtin "whiten"(%s) : (!hflow.batch<scores>) -> ()

// -----

%r = builtin.unrealized_conversion_cast to !hflow.batch<rollout>
// expected-error @+1 {{'whiten' takes numeric batches, not rollout}}
%x = hflow.builtin "whiten"(%r) : (!hflow.batch<rollout>) -> !hflow.batch<rollout>

// -----

%l = builtin.unrealized_conversion_cast to !hflow.batch<logprobs>
// expected-error @+1 {{'rollout_logprobs' input 1 must be rollout, got logprobs}}
%x = hflow.builtin "rollout_logprobs"(%l) : (!hflow.batch<logprobs>) -> !hflow.batch<logprobs>

// -----

%r = builtin.unrealized_conversion_cast to !hflow.batch<rollout>
// expected-error @+1 {{'rollout_logprobs' returns logprobs}}
%x = hflow.builtin "rollout_logprobs"(%r) : (!hflow.batch<rollout>) -> !hflow.batch<scores>

// -----

%s = builtin.unrealized_conversion_cast to !hflow.batch<scores>
// expected-error @+1 {{arithmetic takes no keyword arguments}}
%x = hflow.builtin "neg"(%s) {args = {gamma = 1.0 : f64}} : (!hflow.batch<scores>) -> !hflow.batch<scores>

// -----

%s = builtin.unrealized_conversion_cast to !hflow.batch<scores>
// expected-error @+1 {{arithmetic has one result}}
%x:2 = hflow.builtin "add"(%s, %s) : (!hflow.batch<scores>, !hflow.batch<scores>) -> (!hflow.batch<scores>, !hflow.batch<scores>)

// -----

%s = builtin.unrealized_conversion_cast to !hflow.batch<scores>
// expected-error @+1 {{'neg' takes one batch}}
%x = hflow.builtin "neg"(%s, %s) : (!hflow.batch<scores>, !hflow.batch<scores>) -> !hflow.batch<scores>

// -----

%s = builtin.unrealized_conversion_cast to !hflow.batch<scores>
// expected-error @+1 {{'mul' with a scalar takes one batch}}
%x = hflow.builtin "mul"(%s, %s) {scalar = 2.0 : f64} : (!hflow.batch<scores>, !hflow.batch<scores>) -> !hflow.batch<scores>

// -----

%s = builtin.unrealized_conversion_cast to !hflow.batch<scores>
// expected-error @+1 {{'neg' takes no scalar}}
%x = hflow.builtin "neg"(%s) {scalar = 2.0 : f64} : (!hflow.batch<scores>) -> !hflow.batch<scores>

// -----

%s = builtin.unrealized_conversion_cast to !hflow.batch<scores>
// expected-error @+1 {{result kind values differs from the input's scores}}
%x = hflow.builtin "mul"(%s) {scalar = 2.0 : f64} : (!hflow.batch<scores>) -> !hflow.batch<values>

// -----

%s = builtin.unrealized_conversion_cast to !hflow.batch<scores>
// expected-error @+1 {{'scalar_lhs' needs 'scalar'}}
%x = hflow.builtin "sub"(%s, %s) {scalar_lhs} : (!hflow.batch<scores>, !hflow.batch<scores>) -> !hflow.batch<scores>

// -----

%s = builtin.unrealized_conversion_cast to !hflow.batch<scores>
// expected-error @+1 {{'sub' takes two batches, or one and a scalar}}
%x = hflow.builtin "sub"(%s) : (!hflow.batch<scores>) -> !hflow.batch<scores>

// -----

%l = builtin.unrealized_conversion_cast to !hflow.batch<logprobs>
%v = builtin.unrealized_conversion_cast to !hflow.batch<values>
// expected-error @+1 {{cannot add logprobs and values}}
%x = hflow.builtin "add"(%l, %v) : (!hflow.batch<logprobs>, !hflow.batch<values>) -> !hflow.batch<logprobs>

// -----

%s = builtin.unrealized_conversion_cast to !hflow.batch<scores>
%k = builtin.unrealized_conversion_cast to !hflow.batch<kl>
// expected-error @+1 {{result kind must be scores}}
%x = hflow.builtin "sub"(%s, %k) {scale_rhs = 0.1 : f64} : (!hflow.batch<scores>, !hflow.batch<kl>) -> !hflow.batch<kl>

// -----

%s = builtin.unrealized_conversion_cast to !hflow.batch<scores>
// expected-error @+1 {{'scalar', 'scalar_lhs' and 'scale_rhs' are for arithmetic}}
%x = hflow.builtin "whiten"(%s) {scalar = 2.0 : f64} : (!hflow.batch<scores>) -> !hflow.batch<scores>

// -----

%s = builtin.unrealized_conversion_cast to !hflow.batch<scores>
// expected-error @+1 {{unknown builtin 'softmax'; builtins: gae, grpo_advantage, rloo_advantage, reinforce_pp, reinforce_pp_baseline, remax, kl, whiten, clip, running_norm, overlong_penalty, rollout_logprobs, env_reward, filter_groups, add, sub, mul, div, neg}}
%x = hflow.builtin "softmax"(%s) : (!hflow.batch<scores>) -> !hflow.batch<scores>

// -----

%s = builtin.unrealized_conversion_cast to !hflow.batch<scores>
// expected-error @+1 {{'gae' takes 2 inputs, got 1}}
%x:2 = hflow.builtin "gae"(%s) : (!hflow.batch<scores>) -> (!hflow.batch<advantages>, !hflow.batch<returns>)

// -----

%v = builtin.unrealized_conversion_cast to !hflow.batch<values>
// expected-error @+1 {{'gae' input 1 must be scores, got values}}
%x:2 = hflow.builtin "gae"(%v, %v) : (!hflow.batch<values>, !hflow.batch<values>) -> (!hflow.batch<advantages>, !hflow.batch<returns>)

// -----

%s = builtin.unrealized_conversion_cast to !hflow.batch<scores>
%v = builtin.unrealized_conversion_cast to !hflow.batch<values>
// expected-error @+1 {{'gae' has 2 results}}
%x = hflow.builtin "gae"(%s, %v) : (!hflow.batch<scores>, !hflow.batch<values>) -> !hflow.batch<advantages>

// -----

%l = builtin.unrealized_conversion_cast to !hflow.batch<logprobs>
// expected-error @+1 {{'kl' has 1 result}}
%x:2 = hflow.builtin "kl"(%l, %l) : (!hflow.batch<logprobs>, !hflow.batch<logprobs>) -> (!hflow.batch<kl>, !hflow.batch<kl>)

// -----

%s = builtin.unrealized_conversion_cast to !hflow.batch<scores>
%v = builtin.unrealized_conversion_cast to !hflow.batch<values>
// expected-error @+1 {{'gae' returns advantages}}
%x:2 = hflow.builtin "gae"(%s, %v) : (!hflow.batch<scores>, !hflow.batch<values>) -> (!hflow.batch<scores>, !hflow.batch<returns>)

// -----

%s = builtin.unrealized_conversion_cast to !hflow.batch<scores>
%v = builtin.unrealized_conversion_cast to !hflow.batch<values>
// expected-error @+1 {{'gae' returns returns second}}
%x:2 = hflow.builtin "gae"(%s, %v) : (!hflow.batch<scores>, !hflow.batch<values>) -> (!hflow.batch<advantages>, !hflow.batch<advantages>)

// -----

%s = builtin.unrealized_conversion_cast to !hflow.batch<scores>
// expected-error @+1 {{'whiten' returns scores}}
%x = hflow.builtin "whiten"(%s) : (!hflow.batch<scores>) -> !hflow.batch<advantages>

// -----

%s = builtin.unrealized_conversion_cast to !hflow.batch<scores>
%v = builtin.unrealized_conversion_cast to !hflow.batch<values>
// expected-error @+1 {{'gae' has no argument 'beta'}}
%x:2 = hflow.builtin "gae"(%s, %v) {args = {beta = 1.0 : f64}} : (!hflow.batch<scores>, !hflow.batch<values>) -> (!hflow.batch<advantages>, !hflow.batch<returns>)

// -----

// expected-error @+1 {{layout dp and fsdp must be positive, or 0 for 'inferred', got dp = -1, fsdp = 1}}
hflow.role @a reward_fn "r" train <dp = -1, tp = 1, pp = 1> generate <dp = 1, tp = 1, pp = 1>

// -----

// expected-error @+1 {{layout degree 2000000 is larger than any mesh}}
hflow.role @a reward_fn "r" train <dp = 1, tp = 1, pp = 1, fsdp = 2000000> generate <dp = 1, tp = 1, pp = 1>
