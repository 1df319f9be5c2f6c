// For tests: a small, valid RegisterRequest to start from.
#ifndef TOWERPS_PS_REGISTER_REQUEST_TESTING_H_
#define TOWERPS_PS_REGISTER_REQUEST_TESTING_H_

#include "proto/ps.pb.h"
#include "proto/tensor.pb.h"

namespace towerps::ps {

// TwoVarJob's SGD learning rate.
inline constexpr float kTwoVarJobLearningRate = 0.5f;

// Job "j" of `workers` workers in `mode` with SGD at kTwoVarJobLearningRate:
// variable "a" of shape [2, 3], every element 1 (CONSTANT), and "b" of
// shape [2], zeros.
inline v1::RegisterRequest TwoVarJob(v1::Mode mode, int workers, int replicas = 0,
                                     int max_staleness = 0) {
  v1::RegisterRequest r;
  r.set_job_id("j");
  r.mutable_config()->set_mode(mode);
  r.mutable_config()->set_num_workers(workers);
  r.mutable_config()->set_replicas_to_aggregate(replicas);
  r.mutable_config()->set_max_staleness(max_staleness);
  r.mutable_config()->mutable_optimizer()->set_type(v1::OptimizerSpec::SGD);
  r.mutable_config()->mutable_optimizer()->set_learning_rate(kTwoVarJobLearningRate);
  auto* a = r.add_variables();
  a->set_name("a");
  a->add_shape(2);
  a->add_shape(3);
  a->set_dtype(v1::DT_FLOAT32);
  a->mutable_initializer()->set_type(v1::Initializer::CONSTANT);
  a->mutable_initializer()->set_value(1.0f);
  auto* b = r.add_variables();
  b->set_name("b");
  b->add_shape(2);
  b->set_dtype(v1::DT_FLOAT32);
  return r;
}

}  // namespace towerps::ps

#endif  // TOWERPS_PS_REGISTER_REQUEST_TESTING_H_
