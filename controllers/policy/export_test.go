package policy

// ApplyValidation is the field validation directive of the controller's server-side applies.
var ApplyValidation = applyValidation

// ApplyBody is the encoder of the controller's server-side apply bodies.
var ApplyBody = applyBody
