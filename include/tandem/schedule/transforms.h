// Everything to schedule a program: the Schedule, its transformations, lowering and enumeration.
#pragma once

#include "tandem/schedule/as_slice.h"
#include "tandem/schedule/dead_stages.h"
#include "tandem/schedule/enumerate.h"
#include "tandem/schedule/fuse.h"
#include "tandem/schedule/lower.h"
#include "tandem/schedule/overlap.h"
#include "tandem/schedule/plan.h"
#include "tandem/schedule/recipe.h"
#include "tandem/schedule/reorder.h"
#include "tandem/schedule/schedule.h"
#include "tandem/schedule/split.h"
