package reclaim

import "errors"

// What BeginAdd refuses, or fails at, as domain errors: the plugin maps
// each to the CNI error code the runtime acts on.
var (
	// ErrNoNamespace: CNI_NETNS names no network namespace.
	ErrNoNamespace = errors.New("no network namespace")
	// ErrRecordWrite: the attachment record could not be written.
	ErrRecordWrite = errors.New("record not written")
	// ErrAddInProgress: another ADD of the attachment still runs.
	ErrAddInProgress = errors.New("ADD in progress")
	// ErrStillAttached: the attachment still holds its address elsewhere,
	// or in the same namespace: a DEL must come first.
	ErrStillAttached = errors.New("still attached")
)

// AddError is BeginAdd's refusal or failure: Kind is one of the errors
// above, Msg says what happened and what to do, Detail the cause.
type AddError struct {
	Kind   error
	Msg    string
	Detail string
}

func (e *AddError) Error() string { return e.Msg }

func (e *AddError) Unwrap() error { return e.Kind }
