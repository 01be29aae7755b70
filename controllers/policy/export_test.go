package policy

// ApplyValidation is the field validation directive of the controller's server-side applies.
var ApplyValidation = applyValidation
