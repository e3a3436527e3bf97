// Everything a user needs to write a tandem program: the IR, the builder and the workloads.
#pragma once

#include "tandem/dsl/builder.h"
#include "tandem/dsl/ir.h"
#include "tandem/dsl/workloads.h"
