from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class StatusCode(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    OK: _ClassVar[StatusCode]
    NO_SUCH_LEDGER: _ClassVar[StatusCode]
    NO_SUCH_ENTRY: _ClassVar[StatusCode]
    BAD_REQUEST: _ClassVar[StatusCode]
    TOO_LARGE: _ClassVar[StatusCode]
    IO_ERROR: _ClassVar[StatusCode]
    UNAUTHORIZED: _ClassVar[StatusCode]
    FENCED: _ClassVar[StatusCode]
    READ_ONLY: _ClassVar[StatusCode]
    TOO_MANY_REQUESTS: _ClassVar[StatusCode]
    INVALID_COOKIE: _ClassVar[StatusCode]

class BookieState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    WRITABLE: _ClassVar[BookieState]
    READ_ONLY_STATE: _ClassVar[BookieState]

class ReadEnd(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    COMPLETE: _ClassVar[ReadEnd]
    LIMIT: _ClassVar[ReadEnd]
    MISSING: _ClassVar[ReadEnd]
OK: StatusCode
NO_SUCH_LEDGER: StatusCode
NO_SUCH_ENTRY: StatusCode
BAD_REQUEST: StatusCode
TOO_LARGE: StatusCode
IO_ERROR: StatusCode
UNAUTHORIZED: StatusCode
FENCED: StatusCode
READ_ONLY: StatusCode
TOO_MANY_REQUESTS: StatusCode
INVALID_COOKIE: StatusCode
WRITABLE: BookieState
READ_ONLY_STATE: BookieState
COMPLETE: ReadEnd
LIMIT: ReadEnd
MISSING: ReadEnd

class AddRequest(_message.Message):
    __slots__ = ("ledger_id", "master_key", "entries", "recovery", "request_id")
    LEDGER_ID_FIELD_NUMBER: _ClassVar[int]
    MASTER_KEY_FIELD_NUMBER: _ClassVar[int]
    ENTRIES_FIELD_NUMBER: _ClassVar[int]
    RECOVERY_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    ledger_id: int
    master_key: bytes
    entries: bytes
    recovery: bool
    request_id: int
    def __init__(self, ledger_id: _Optional[int] = ..., master_key: _Optional[bytes] = ..., entries: _Optional[bytes] = ..., recovery: _Optional[bool] = ..., request_id: _Optional[int] = ...) -> None: ...

class AddResponse(_message.Message):
    __slots__ = ("code", "message", "ledger_id", "first_entry_id", "last_entry_id", "request_id")
    CODE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    LEDGER_ID_FIELD_NUMBER: _ClassVar[int]
    FIRST_ENTRY_ID_FIELD_NUMBER: _ClassVar[int]
    LAST_ENTRY_ID_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    code: int
    message: str
    ledger_id: int
    first_entry_id: int
    last_entry_id: int
    request_id: int
    def __init__(self, code: _Optional[int] = ..., message: _Optional[str] = ..., ledger_id: _Optional[int] = ..., first_entry_id: _Optional[int] = ..., last_entry_id: _Optional[int] = ..., request_id: _Optional[int] = ...) -> None: ...

class ReadRequest(_message.Message):
    __slots__ = ("ledger_id", "first_entry_id", "last_entry_id", "max_entries", "max_bytes", "fence", "master_key", "sparse", "stripe_ensemble", "stripe_slot", "request_id")
    LEDGER_ID_FIELD_NUMBER: _ClassVar[int]
    FIRST_ENTRY_ID_FIELD_NUMBER: _ClassVar[int]
    LAST_ENTRY_ID_FIELD_NUMBER: _ClassVar[int]
    MAX_ENTRIES_FIELD_NUMBER: _ClassVar[int]
    MAX_BYTES_FIELD_NUMBER: _ClassVar[int]
    FENCE_FIELD_NUMBER: _ClassVar[int]
    MASTER_KEY_FIELD_NUMBER: _ClassVar[int]
    SPARSE_FIELD_NUMBER: _ClassVar[int]
    STRIPE_ENSEMBLE_FIELD_NUMBER: _ClassVar[int]
    STRIPE_SLOT_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    ledger_id: int
    first_entry_id: int
    last_entry_id: int
    max_entries: int
    max_bytes: int
    fence: bool
    master_key: bytes
    sparse: bool
    stripe_ensemble: int
    stripe_slot: int
    request_id: int
    def __init__(self, ledger_id: _Optional[int] = ..., first_entry_id: _Optional[int] = ..., last_entry_id: _Optional[int] = ..., max_entries: _Optional[int] = ..., max_bytes: _Optional[int] = ..., fence: _Optional[bool] = ..., master_key: _Optional[bytes] = ..., sparse: _Optional[bool] = ..., stripe_ensemble: _Optional[int] = ..., stripe_slot: _Optional[int] = ..., request_id: _Optional[int] = ...) -> None: ...

class ReadResponse(_message.Message):
    __slots__ = ("code", "message", "entries", "end", "lac", "fenced", "request_id")
    CODE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    ENTRIES_FIELD_NUMBER: _ClassVar[int]
    END_FIELD_NUMBER: _ClassVar[int]
    LAC_FIELD_NUMBER: _ClassVar[int]
    FENCED_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    code: int
    message: str
    entries: bytes
    end: ReadEnd
    lac: int
    fenced: bool
    request_id: int
    def __init__(self, code: _Optional[int] = ..., message: _Optional[str] = ..., entries: _Optional[bytes] = ..., end: _Optional[_Union[ReadEnd, str]] = ..., lac: _Optional[int] = ..., fenced: _Optional[bool] = ..., request_id: _Optional[int] = ...) -> None: ...

class ReadLacRequest(_message.Message):
    __slots__ = ("ledger_id", "fence", "master_key", "wait_for_lac_above", "timeout_ms")
    LEDGER_ID_FIELD_NUMBER: _ClassVar[int]
    FENCE_FIELD_NUMBER: _ClassVar[int]
    MASTER_KEY_FIELD_NUMBER: _ClassVar[int]
    WAIT_FOR_LAC_ABOVE_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_MS_FIELD_NUMBER: _ClassVar[int]
    ledger_id: int
    fence: bool
    master_key: bytes
    wait_for_lac_above: int
    timeout_ms: int
    def __init__(self, ledger_id: _Optional[int] = ..., fence: _Optional[bool] = ..., master_key: _Optional[bytes] = ..., wait_for_lac_above: _Optional[int] = ..., timeout_ms: _Optional[int] = ...) -> None: ...

class ReadLacResponse(_message.Message):
    __slots__ = ("code", "message", "lac", "last_entry_id", "fenced", "master_key")
    CODE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    LAC_FIELD_NUMBER: _ClassVar[int]
    LAST_ENTRY_ID_FIELD_NUMBER: _ClassVar[int]
    FENCED_FIELD_NUMBER: _ClassVar[int]
    MASTER_KEY_FIELD_NUMBER: _ClassVar[int]
    code: int
    message: str
    lac: int
    last_entry_id: int
    fenced: bool
    master_key: bytes
    def __init__(self, code: _Optional[int] = ..., message: _Optional[str] = ..., lac: _Optional[int] = ..., last_entry_id: _Optional[int] = ..., fenced: _Optional[bool] = ..., master_key: _Optional[bytes] = ...) -> None: ...

class FenceRequest(_message.Message):
    __slots__ = ("ledger_id", "master_key")
    LEDGER_ID_FIELD_NUMBER: _ClassVar[int]
    MASTER_KEY_FIELD_NUMBER: _ClassVar[int]
    ledger_id: int
    master_key: bytes
    def __init__(self, ledger_id: _Optional[int] = ..., master_key: _Optional[bytes] = ...) -> None: ...

class FenceResponse(_message.Message):
    __slots__ = ("code", "message", "lac", "last_entry_id")
    CODE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    LAC_FIELD_NUMBER: _ClassVar[int]
    LAST_ENTRY_ID_FIELD_NUMBER: _ClassVar[int]
    code: int
    message: str
    lac: int
    last_entry_id: int
    def __init__(self, code: _Optional[int] = ..., message: _Optional[str] = ..., lac: _Optional[int] = ..., last_entry_id: _Optional[int] = ...) -> None: ...

class WriteLacRequest(_message.Message):
    __slots__ = ("ledger_id", "master_key", "lac")
    LEDGER_ID_FIELD_NUMBER: _ClassVar[int]
    MASTER_KEY_FIELD_NUMBER: _ClassVar[int]
    LAC_FIELD_NUMBER: _ClassVar[int]
    ledger_id: int
    master_key: bytes
    lac: int
    def __init__(self, ledger_id: _Optional[int] = ..., master_key: _Optional[bytes] = ..., lac: _Optional[int] = ...) -> None: ...

class WriteLacResponse(_message.Message):
    __slots__ = ("code", "message")
    CODE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    code: int
    message: str
    def __init__(self, code: _Optional[int] = ..., message: _Optional[str] = ...) -> None: ...

class BookieInfoRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class BookieInfoResponse(_message.Message):
    __slots__ = ("code", "message", "bookie_id", "free_bytes", "total_bytes", "state", "ledger_count", "entry_count", "protocol_version")
    CODE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    BOOKIE_ID_FIELD_NUMBER: _ClassVar[int]
    FREE_BYTES_FIELD_NUMBER: _ClassVar[int]
    TOTAL_BYTES_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    LEDGER_COUNT_FIELD_NUMBER: _ClassVar[int]
    ENTRY_COUNT_FIELD_NUMBER: _ClassVar[int]
    PROTOCOL_VERSION_FIELD_NUMBER: _ClassVar[int]
    code: int
    message: str
    bookie_id: str
    free_bytes: int
    total_bytes: int
    state: BookieState
    ledger_count: int
    entry_count: int
    protocol_version: int
    def __init__(self, code: _Optional[int] = ..., message: _Optional[str] = ..., bookie_id: _Optional[str] = ..., free_bytes: _Optional[int] = ..., total_bytes: _Optional[int] = ..., state: _Optional[_Union[BookieState, str]] = ..., ledger_count: _Optional[int] = ..., entry_count: _Optional[int] = ..., protocol_version: _Optional[int] = ...) -> None: ...

class ListLedgersRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListLedgersResponse(_message.Message):
    __slots__ = ("code", "message", "ledger_ids")
    CODE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    LEDGER_IDS_FIELD_NUMBER: _ClassVar[int]
    code: int
    message: str
    ledger_ids: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, code: _Optional[int] = ..., message: _Optional[str] = ..., ledger_ids: _Optional[_Iterable[int]] = ...) -> None: ...

class PullRequest(_message.Message):
    __slots__ = ("ledger_id", "master_key", "source_address", "source_lane_address", "wanted_ids", "digest_type", "read_window", "source_bookie_id")
    LEDGER_ID_FIELD_NUMBER: _ClassVar[int]
    MASTER_KEY_FIELD_NUMBER: _ClassVar[int]
    SOURCE_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    SOURCE_LANE_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    WANTED_IDS_FIELD_NUMBER: _ClassVar[int]
    DIGEST_TYPE_FIELD_NUMBER: _ClassVar[int]
    READ_WINDOW_FIELD_NUMBER: _ClassVar[int]
    SOURCE_BOOKIE_ID_FIELD_NUMBER: _ClassVar[int]
    ledger_id: int
    master_key: bytes
    source_address: str
    source_lane_address: str
    wanted_ids: bytes
    digest_type: str
    read_window: int
    source_bookie_id: str
    def __init__(self, ledger_id: _Optional[int] = ..., master_key: _Optional[bytes] = ..., source_address: _Optional[str] = ..., source_lane_address: _Optional[str] = ..., wanted_ids: _Optional[bytes] = ..., digest_type: _Optional[str] = ..., read_window: _Optional[int] = ..., source_bookie_id: _Optional[str] = ...) -> None: ...

class PullResponse(_message.Message):
    __slots__ = ("code", "message", "entries", "byte_count", "missing_ids")
    CODE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    ENTRIES_FIELD_NUMBER: _ClassVar[int]
    BYTE_COUNT_FIELD_NUMBER: _ClassVar[int]
    MISSING_IDS_FIELD_NUMBER: _ClassVar[int]
    code: int
    message: str
    entries: int
    byte_count: int
    missing_ids: bytes
    def __init__(self, code: _Optional[int] = ..., message: _Optional[str] = ..., entries: _Optional[int] = ..., byte_count: _Optional[int] = ..., missing_ids: _Optional[bytes] = ...) -> None: ...

class HealthRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class HealthResponse(_message.Message):
    __slots__ = ("serving", "bookie_id")
    SERVING_FIELD_NUMBER: _ClassVar[int]
    BOOKIE_ID_FIELD_NUMBER: _ClassVar[int]
    serving: bool
    bookie_id: str
    def __init__(self, serving: _Optional[bool] = ..., bookie_id: _Optional[str] = ...) -> None: ...
