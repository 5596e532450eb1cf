package annals

import (
	"errors"
	"fmt"
)

// Error is a refusal the server answered: its HTTP status, its stable kind (for example
// "invalid_tag", "event_too_large", "schema_violation", "database_unavailable") and its
// message. Nothing of a refused append was stored, unless the kind is "outcome_unknown".
type Error struct {
	Status     int
	Kind       string
	Message    string
	Violations []Violation
}

// Violation is one event's fault against its type's schema (kind "schema_violation").
type Violation struct {
	Index        int    `json:"index"`
	Type         string `json:"type"`
	Version      int    `json:"version"`
	InstancePath string `json:"instancePath"`
	SchemaPath   string `json:"schemaPath"`
	Message      string `json:"message"`
}

func (e *Error) Error() string {
	return fmt.Sprintf("annals: %s (%d %s)", e.Message, e.Status, e.Kind)
}

// Is makes errors.Is(err, ErrInvalidInput) and the other classes below answer for an Error of
// their class.
func (e *Error) Is(target error) bool {
	class, ok := target.(*errorClass)
	return ok && class.has(e)
}

// errorClass is a class of the server's refusals, matched with errors.Is.
type errorClass struct {
	name string
	has  func(*Error) bool
}

func (c *errorClass) Error() string { return "annals: " + c.name }

var (
	// ErrInvalidInput: the request was refused as it was (a bad tag, type, query or option,
	// too many events or tags); sending it again changes nothing.
	ErrInvalidInput = &errorClass{"invalid input", func(e *Error) bool {
		return e.Status == 400 || e.Status == 422
	}}
	// ErrTooLarge: an event, an append or a request body over the server's limits.
	ErrTooLarge = &errorClass{"too large", func(e *Error) bool {
		switch e.Kind {
		case "event_too_large", "append_too_large", "body_too_large", "too_many_events",
			"query_too_large":
			return true
		}
		return e.Status == 413
	}}
	// ErrSchemaViolation: an event did not satisfy its type's schema (see Error.Violations).
	ErrSchemaViolation = &errorClass{"schema violation", func(e *Error) bool {
		return e.Kind == "schema_violation"
	}}
	// ErrUnauthorized: no valid API key, or one without the scope the request needs.
	ErrUnauthorized = &errorClass{"unauthorized", func(e *Error) bool {
		return e.Status == 401 || e.Status == 403
	}}
	// ErrUnavailable: nothing was done and the request may be sent again later (the database
	// away, a full queue, a full disk, a server shutting down).
	ErrUnavailable = &errorClass{"unavailable", func(e *Error) bool {
		return e.Kind != "outcome_unknown" && (e.Status == 503 || e.Status == 429 ||
			e.Status == 507)
	}}
	// ErrOutcomeUnknown: the append may or may not be stored; read to find out, or send it
	// again with the same event ids under the same condition.
	ErrOutcomeUnknown = &errorClass{"outcome unknown", func(e *Error) bool {
		return e.Kind == "outcome_unknown"
	}}
)

// ConditionFailedError answers an append whose condition failed: an event matching its query
// was appended after its position, the first such at Position. Nothing was appended.
type ConditionFailedError struct {
	Position uint64
}

func (e *ConditionFailedError) Error() string {
	return fmt.Sprintf("annals: append condition failed: a matching event at position %d",
		e.Position)
}

// ErrConditionFailed matches a ConditionFailedError with errors.Is.
var ErrConditionFailed = errors.New("annals: append condition failed")

func (e *ConditionFailedError) Is(target error) bool { return target == ErrConditionFailed }

// UnreachableError: the server could not be reached or its answer was cut off (refused
// connection, timeout, a connection closed mid-answer). For an append the outcome is not
// known: see ErrOutcomeUnknown.
type UnreachableError struct {
	URL string
	Err error
}

func (e *UnreachableError) Error() string {
	return fmt.Sprintf("annals: %s could not be reached: %v", e.URL, e.Err)
}

func (e *UnreachableError) Unwrap() error { return e.Err }

// ErrUnreachable matches an UnreachableError with errors.Is.
var ErrUnreachable = errors.New("annals: server unreachable")

func (e *UnreachableError) Is(target error) bool { return target == ErrUnreachable }
