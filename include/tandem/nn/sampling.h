// Drawing the next token from a model's logits: softmax(logits / temperature), computed stably.
#pragma once

namespace tandem::nn {

// The token drawn from softmax(logits / temperature) over logits (V), restricted to the top_k
// largest logits when 0 < top_k < V, with the uniform number u in [0, 1). The weights are
// exp((logit - largest) / temperature) in double: the largest weighs 1, so none overflows and the
// most likely token keeps its weight however small the temperature; as the temperature goes to 0
// the draw becomes the greedy choice. Temperature 0 is greedy: the first largest logit. Logits
// that are NaN are UserErrors (a model whose weights are not finite).
int sample_token(const float* logits, int V, double temperature, int top_k, double u);

}  // namespace tandem::nn
