package policy

// ApplyValidation is the field validation directive of the controller's server-side applies.
var ApplyValidation = applyValidation

// ApplyBody is the encoder of the controller's server-side apply bodies.
var ApplyBody = applyBody

// KeptJudged is how many objects k judged anew (not kept) since it was made.
func KeptJudged(k *KeptVetter) int { return k.judged }
