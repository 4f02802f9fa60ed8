// Umbrella header: everything a training program needs.
#pragma once
#include "deepspeed/args.h"
#include "deepspeed/comm.h"
#include "deepspeed/config.h"
#include "deepspeed/data.h"
#include "deepspeed/engine.h"
#include "deepspeed/errors.h"
#include "deepspeed/lr_scheduler.h"
#include "deepspeed/memory.h"
#include "deepspeed/optimizer.h"
#include "deepspeed/topology.h"
#include "deepspeed/zero_init.h"
#include "deepspeed/zero_unit.h"
