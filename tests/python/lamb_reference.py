"""LAMB in plain PyTorch, the reference the fused optimizer's tests compare with: the formula of the
lamb_bucket program (src/dsl/workloads.cc, lamb_step), one segment a parameter tensor, in float32,
on a gradient already averaged over the ranks."""


class ReferenceLAMB:
    """LAMB with bias-corrected moments and decoupled weight decay inside the direction; the trust
    ratio ||w|| / ||r|| per tensor (1 where either norm is 0)."""

    def __init__(self, torch, params, lr, betas, eps, weight_decay):
        self.torch = torch
        self.params = list(params)
        self.lr, self.betas, self.eps, self.weight_decay = lr, betas, eps, weight_decay
        self.m = [torch.zeros_like(p) for p in self.params]
        self.v = [torch.zeros_like(p) for p in self.params]
        self.steps = 0

    def step(self, grads):
        """One step with `grads`, one averaged gradient a parameter."""
        torch = self.torch
        b1, b2 = self.betas
        self.steps += 1
        bc1, bc2 = 1 - b1 ** self.steps, 1 - b2 ** self.steps
        with torch.no_grad():
            for w, g, m, v in zip(self.params, grads, self.m, self.v):
                m.mul_(b1).add_((1 - b1) * g)
                v.mul_(b2).add_((1 - b2) * g * g)
                r = (m / bc1) / ((v / bc2).sqrt() + self.eps) + self.weight_decay * w
                w_norm, r_norm = w.norm(), r.norm()
                trust = w_norm / r_norm if w_norm > 0 and r_norm > 0 else 1.0
                w.sub_(self.lr * trust * r)
