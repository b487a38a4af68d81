from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from typing import ClassVar as _ClassVar, Iterable as _Iterable, Mapping as _Mapping, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Encoding(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    ENCODING_UNSPECIFIED: _ClassVar[Encoding]
    LINEAR16: _ClassVar[Encoding]
    MULAW: _ClassVar[Encoding]
    ALAW: _ClassVar[Encoding]

class TurnDetection(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    TURN_DETECTION_UNSPECIFIED: _ClassVar[TurnDetection]
    TURN_DETECTION_OFF: _ClassVar[TurnDetection]
    TURN_DETECTION_SILENCE: _ClassVar[TurnDetection]
    TURN_DETECTION_SMART: _ClassVar[TurnDetection]

class EchoHandling(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    ECHO_HANDLING_UNSPECIFIED: _ClassVar[EchoHandling]
    ECHO_HANDLING_GATE: _ClassVar[EchoHandling]
    ECHO_HANDLING_AEC3: _ClassVar[EchoHandling]
    ECHO_HANDLING_GATE_AEC3: _ClassVar[EchoHandling]

class BargeIn(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    BARGE_IN_UNSPECIFIED: _ClassVar[BargeIn]
    BARGE_IN_IMMEDIATE: _ClassVar[BargeIn]
    BARGE_IN_AFTER_WORDS: _ClassVar[BargeIn]
    BARGE_IN_NEVER: _ClassVar[BargeIn]
ENCODING_UNSPECIFIED: Encoding
LINEAR16: Encoding
MULAW: Encoding
ALAW: Encoding
TURN_DETECTION_UNSPECIFIED: TurnDetection
TURN_DETECTION_OFF: TurnDetection
TURN_DETECTION_SILENCE: TurnDetection
TURN_DETECTION_SMART: TurnDetection
ECHO_HANDLING_UNSPECIFIED: EchoHandling
ECHO_HANDLING_GATE: EchoHandling
ECHO_HANDLING_AEC3: EchoHandling
ECHO_HANDLING_GATE_AEC3: EchoHandling
BARGE_IN_UNSPECIFIED: BargeIn
BARGE_IN_IMMEDIATE: BargeIn
BARGE_IN_AFTER_WORDS: BargeIn
BARGE_IN_NEVER: BargeIn

class AudioFormat(_message.Message):
    __slots__ = ("encoding", "sample_rate_hertz")
    ENCODING_FIELD_NUMBER: _ClassVar[int]
    SAMPLE_RATE_HERTZ_FIELD_NUMBER: _ClassVar[int]
    encoding: Encoding
    sample_rate_hertz: int
    def __init__(self, encoding: _Optional[_Union[Encoding, str]] = ..., sample_rate_hertz: _Optional[int] = ...) -> None: ...

class ConverseRequest(_message.Message):
    __slots__ = ("config", "audio", "speak", "clear", "mark", "hangup", "flush", "dtmf")
    CONFIG_FIELD_NUMBER: _ClassVar[int]
    AUDIO_FIELD_NUMBER: _ClassVar[int]
    SPEAK_FIELD_NUMBER: _ClassVar[int]
    CLEAR_FIELD_NUMBER: _ClassVar[int]
    MARK_FIELD_NUMBER: _ClassVar[int]
    HANGUP_FIELD_NUMBER: _ClassVar[int]
    FLUSH_FIELD_NUMBER: _ClassVar[int]
    DTMF_FIELD_NUMBER: _ClassVar[int]
    config: SessionConfig
    audio: AudioChunk
    speak: Speak
    clear: Clear
    mark: Mark
    hangup: Hangup
    flush: Flush
    dtmf: Dtmf
    def __init__(self, config: _Optional[_Union[SessionConfig, _Mapping]] = ..., audio: _Optional[_Union[AudioChunk, _Mapping]] = ..., speak: _Optional[_Union[Speak, _Mapping]] = ..., clear: _Optional[_Union[Clear, _Mapping]] = ..., mark: _Optional[_Union[Mark, _Mapping]] = ..., hangup: _Optional[_Union[Hangup, _Mapping]] = ..., flush: _Optional[_Union[Flush, _Mapping]] = ..., dtmf: _Optional[_Union[Dtmf, _Mapping]] = ...) -> None: ...

class SessionConfig(_message.Message):
    __slots__ = ("input_audio", "output_audio", "vad", "interim_results", "interim_interval_ms", "language", "model", "decoding", "voice", "barge_in", "call_id", "turn_detection")
    INPUT_AUDIO_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_AUDIO_FIELD_NUMBER: _ClassVar[int]
    VAD_FIELD_NUMBER: _ClassVar[int]
    INTERIM_RESULTS_FIELD_NUMBER: _ClassVar[int]
    INTERIM_INTERVAL_MS_FIELD_NUMBER: _ClassVar[int]
    LANGUAGE_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    DECODING_FIELD_NUMBER: _ClassVar[int]
    VOICE_FIELD_NUMBER: _ClassVar[int]
    BARGE_IN_FIELD_NUMBER: _ClassVar[int]
    CALL_ID_FIELD_NUMBER: _ClassVar[int]
    TURN_DETECTION_FIELD_NUMBER: _ClassVar[int]
    input_audio: AudioFormat
    output_audio: AudioFormat
    vad: VadConfig
    interim_results: bool
    interim_interval_ms: int
    language: str
    model: str
    decoding: DecodingOptions
    voice: str
    barge_in: BargeInConfig
    call_id: str
    turn_detection: TurnDetectionOptions
    def __init__(self, input_audio: _Optional[_Union[AudioFormat, _Mapping]] = ..., output_audio: _Optional[_Union[AudioFormat, _Mapping]] = ..., vad: _Optional[_Union[VadConfig, _Mapping]] = ..., interim_results: bool = ..., interim_interval_ms: _Optional[int] = ..., language: _Optional[str] = ..., model: _Optional[str] = ..., decoding: _Optional[_Union[DecodingOptions, _Mapping]] = ..., voice: _Optional[str] = ..., barge_in: _Optional[_Union[BargeInConfig, _Mapping]] = ..., call_id: _Optional[str] = ..., turn_detection: _Optional[_Union[TurnDetectionOptions, _Mapping]] = ...) -> None: ...

class TurnDetectionOptions(_message.Message):
    __slots__ = ("mode", "eagerness", "end_silence_ms", "max_pause_ms", "audio_model")
    MODE_FIELD_NUMBER: _ClassVar[int]
    EAGERNESS_FIELD_NUMBER: _ClassVar[int]
    END_SILENCE_MS_FIELD_NUMBER: _ClassVar[int]
    MAX_PAUSE_MS_FIELD_NUMBER: _ClassVar[int]
    AUDIO_MODEL_FIELD_NUMBER: _ClassVar[int]
    mode: TurnDetection
    eagerness: float
    end_silence_ms: int
    max_pause_ms: int
    audio_model: str
    def __init__(self, mode: _Optional[_Union[TurnDetection, str]] = ..., eagerness: _Optional[float] = ..., end_silence_ms: _Optional[int] = ..., max_pause_ms: _Optional[int] = ..., audio_model: _Optional[str] = ...) -> None: ...

class VadConfig(_message.Message):
    __slots__ = ("aggressiveness", "frame_ms", "start_speech_ms", "end_silence_ms", "min_speech_ms", "max_utterance_ms", "pre_roll_ms")
    AGGRESSIVENESS_FIELD_NUMBER: _ClassVar[int]
    FRAME_MS_FIELD_NUMBER: _ClassVar[int]
    START_SPEECH_MS_FIELD_NUMBER: _ClassVar[int]
    END_SILENCE_MS_FIELD_NUMBER: _ClassVar[int]
    MIN_SPEECH_MS_FIELD_NUMBER: _ClassVar[int]
    MAX_UTTERANCE_MS_FIELD_NUMBER: _ClassVar[int]
    PRE_ROLL_MS_FIELD_NUMBER: _ClassVar[int]
    aggressiveness: int
    frame_ms: int
    start_speech_ms: int
    end_silence_ms: int
    min_speech_ms: int
    max_utterance_ms: int
    pre_roll_ms: int
    def __init__(self, aggressiveness: _Optional[int] = ..., frame_ms: _Optional[int] = ..., start_speech_ms: _Optional[int] = ..., end_silence_ms: _Optional[int] = ..., min_speech_ms: _Optional[int] = ..., max_utterance_ms: _Optional[int] = ..., pre_roll_ms: _Optional[int] = ...) -> None: ...

class BargeInConfig(_message.Message):
    __slots__ = ("disabled", "min_speech_ms", "policy", "min_words", "backchannels", "echo_guard_disabled", "echo_handling")
    DISABLED_FIELD_NUMBER: _ClassVar[int]
    MIN_SPEECH_MS_FIELD_NUMBER: _ClassVar[int]
    POLICY_FIELD_NUMBER: _ClassVar[int]
    MIN_WORDS_FIELD_NUMBER: _ClassVar[int]
    BACKCHANNELS_FIELD_NUMBER: _ClassVar[int]
    ECHO_GUARD_DISABLED_FIELD_NUMBER: _ClassVar[int]
    ECHO_HANDLING_FIELD_NUMBER: _ClassVar[int]
    disabled: bool
    min_speech_ms: int
    policy: BargeIn
    min_words: int
    backchannels: _containers.RepeatedScalarFieldContainer[str]
    echo_guard_disabled: bool
    echo_handling: EchoHandling
    def __init__(self, disabled: bool = ..., min_speech_ms: _Optional[int] = ..., policy: _Optional[_Union[BargeIn, str]] = ..., min_words: _Optional[int] = ..., backchannels: _Optional[_Iterable[str]] = ..., echo_guard_disabled: bool = ..., echo_handling: _Optional[_Union[EchoHandling, str]] = ...) -> None: ...

class DecodingOptions(_message.Message):
    __slots__ = ("beam_size", "mbr_candidates", "max_alternatives", "word_timestamps", "initial_prompt", "hotwords", "translate", "disable_silence_policy", "boosted_phrases")
    BEAM_SIZE_FIELD_NUMBER: _ClassVar[int]
    MBR_CANDIDATES_FIELD_NUMBER: _ClassVar[int]
    MAX_ALTERNATIVES_FIELD_NUMBER: _ClassVar[int]
    WORD_TIMESTAMPS_FIELD_NUMBER: _ClassVar[int]
    INITIAL_PROMPT_FIELD_NUMBER: _ClassVar[int]
    HOTWORDS_FIELD_NUMBER: _ClassVar[int]
    TRANSLATE_FIELD_NUMBER: _ClassVar[int]
    DISABLE_SILENCE_POLICY_FIELD_NUMBER: _ClassVar[int]
    BOOSTED_PHRASES_FIELD_NUMBER: _ClassVar[int]
    beam_size: int
    mbr_candidates: int
    max_alternatives: int
    word_timestamps: bool
    initial_prompt: str
    hotwords: _containers.RepeatedScalarFieldContainer[str]
    translate: bool
    disable_silence_policy: bool
    boosted_phrases: _containers.RepeatedCompositeFieldContainer[PhraseBoost]
    def __init__(self, beam_size: _Optional[int] = ..., mbr_candidates: _Optional[int] = ..., max_alternatives: _Optional[int] = ..., word_timestamps: bool = ..., initial_prompt: _Optional[str] = ..., hotwords: _Optional[_Iterable[str]] = ..., translate: bool = ..., disable_silence_policy: bool = ..., boosted_phrases: _Optional[_Iterable[_Union[PhraseBoost, _Mapping]]] = ...) -> None: ...

class PhraseBoost(_message.Message):
    __slots__ = ("phrase", "boost")
    PHRASE_FIELD_NUMBER: _ClassVar[int]
    BOOST_FIELD_NUMBER: _ClassVar[int]
    phrase: str
    boost: float
    def __init__(self, phrase: _Optional[str] = ..., boost: _Optional[float] = ...) -> None: ...

class AudioChunk(_message.Message):
    __slots__ = ("data",)
    DATA_FIELD_NUMBER: _ClassVar[int]
    data: bytes
    def __init__(self, data: _Optional[bytes] = ...) -> None: ...

class Speak(_message.Message):
    __slots__ = ("text", "speak_id", "voice", "rate", "speaker_id", "uninterruptible", "barge_in", "barge_in_min_words")
    TEXT_FIELD_NUMBER: _ClassVar[int]
    SPEAK_ID_FIELD_NUMBER: _ClassVar[int]
    VOICE_FIELD_NUMBER: _ClassVar[int]
    RATE_FIELD_NUMBER: _ClassVar[int]
    SPEAKER_ID_FIELD_NUMBER: _ClassVar[int]
    UNINTERRUPTIBLE_FIELD_NUMBER: _ClassVar[int]
    BARGE_IN_FIELD_NUMBER: _ClassVar[int]
    BARGE_IN_MIN_WORDS_FIELD_NUMBER: _ClassVar[int]
    text: str
    speak_id: str
    voice: str
    rate: float
    speaker_id: int
    uninterruptible: bool
    barge_in: BargeIn
    barge_in_min_words: int
    def __init__(self, text: _Optional[str] = ..., speak_id: _Optional[str] = ..., voice: _Optional[str] = ..., rate: _Optional[float] = ..., speaker_id: _Optional[int] = ..., uninterruptible: bool = ..., barge_in: _Optional[_Union[BargeIn, str]] = ..., barge_in_min_words: _Optional[int] = ...) -> None: ...

class Clear(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class Mark(_message.Message):
    __slots__ = ("name",)
    NAME_FIELD_NUMBER: _ClassVar[int]
    name: str
    def __init__(self, name: _Optional[str] = ...) -> None: ...

class Hangup(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class Flush(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class Dtmf(_message.Message):
    __slots__ = ("digit", "duration_ms")
    DIGIT_FIELD_NUMBER: _ClassVar[int]
    DURATION_MS_FIELD_NUMBER: _ClassVar[int]
    digit: str
    duration_ms: int
    def __init__(self, digit: _Optional[str] = ..., duration_ms: _Optional[int] = ...) -> None: ...

class ConverseResponse(_message.Message):
    __slots__ = ("started", "speech", "transcript", "audio", "mark", "interrupted", "error", "dtmf", "playback_finished", "quality_changed", "end_of_turn")
    STARTED_FIELD_NUMBER: _ClassVar[int]
    SPEECH_FIELD_NUMBER: _ClassVar[int]
    TRANSCRIPT_FIELD_NUMBER: _ClassVar[int]
    AUDIO_FIELD_NUMBER: _ClassVar[int]
    MARK_FIELD_NUMBER: _ClassVar[int]
    INTERRUPTED_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    DTMF_FIELD_NUMBER: _ClassVar[int]
    PLAYBACK_FINISHED_FIELD_NUMBER: _ClassVar[int]
    QUALITY_CHANGED_FIELD_NUMBER: _ClassVar[int]
    END_OF_TURN_FIELD_NUMBER: _ClassVar[int]
    started: SessionStarted
    speech: SpeechEvent
    transcript: Transcript
    audio: AudioOut
    mark: MarkReached
    interrupted: PlaybackInterrupted
    error: ErrorEvent
    dtmf: Dtmf
    playback_finished: PlaybackFinished
    quality_changed: QualityChanged
    end_of_turn: EndOfTurn
    def __init__(self, started: _Optional[_Union[SessionStarted, _Mapping]] = ..., speech: _Optional[_Union[SpeechEvent, _Mapping]] = ..., transcript: _Optional[_Union[Transcript, _Mapping]] = ..., audio: _Optional[_Union[AudioOut, _Mapping]] = ..., mark: _Optional[_Union[MarkReached, _Mapping]] = ..., interrupted: _Optional[_Union[PlaybackInterrupted, _Mapping]] = ..., error: _Optional[_Union[ErrorEvent, _Mapping]] = ..., dtmf: _Optional[_Union[Dtmf, _Mapping]] = ..., playback_finished: _Optional[_Union[PlaybackFinished, _Mapping]] = ..., quality_changed: _Optional[_Union[QualityChanged, _Mapping]] = ..., end_of_turn: _Optional[_Union[EndOfTurn, _Mapping]] = ...) -> None: ...

class SessionStarted(_message.Message):
    __slots__ = ("session_id", "effective_config", "model", "voice", "server_version")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    EFFECTIVE_CONFIG_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    VOICE_FIELD_NUMBER: _ClassVar[int]
    SERVER_VERSION_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    effective_config: SessionConfig
    model: str
    voice: str
    server_version: str
    def __init__(self, session_id: _Optional[str] = ..., effective_config: _Optional[_Union[SessionConfig, _Mapping]] = ..., model: _Optional[str] = ..., voice: _Optional[str] = ..., server_version: _Optional[str] = ...) -> None: ...

class SpeechEvent(_message.Message):
    __slots__ = ("type", "offset_ms", "utterance_index")
    class Type(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        TYPE_UNSPECIFIED: _ClassVar[SpeechEvent.Type]
        SPEECH_BEGIN: _ClassVar[SpeechEvent.Type]
        SPEECH_END: _ClassVar[SpeechEvent.Type]
    TYPE_UNSPECIFIED: SpeechEvent.Type
    SPEECH_BEGIN: SpeechEvent.Type
    SPEECH_END: SpeechEvent.Type
    TYPE_FIELD_NUMBER: _ClassVar[int]
    OFFSET_MS_FIELD_NUMBER: _ClassVar[int]
    UTTERANCE_INDEX_FIELD_NUMBER: _ClassVar[int]
    type: SpeechEvent.Type
    offset_ms: int
    utterance_index: int
    def __init__(self, type: _Optional[_Union[SpeechEvent.Type, str]] = ..., offset_ms: _Optional[int] = ..., utterance_index: _Optional[int] = ...) -> None: ...

class Word(_message.Message):
    __slots__ = ("word", "start_ms", "end_ms", "probability")
    WORD_FIELD_NUMBER: _ClassVar[int]
    START_MS_FIELD_NUMBER: _ClassVar[int]
    END_MS_FIELD_NUMBER: _ClassVar[int]
    PROBABILITY_FIELD_NUMBER: _ClassVar[int]
    word: str
    start_ms: int
    end_ms: int
    probability: float
    def __init__(self, word: _Optional[str] = ..., start_ms: _Optional[int] = ..., end_ms: _Optional[int] = ..., probability: _Optional[float] = ...) -> None: ...

class Alternative(_message.Message):
    __slots__ = ("text", "confidence")
    TEXT_FIELD_NUMBER: _ClassVar[int]
    CONFIDENCE_FIELD_NUMBER: _ClassVar[int]
    text: str
    confidence: float
    def __init__(self, text: _Optional[str] = ..., confidence: _Optional[float] = ...) -> None: ...

class Transcript(_message.Message):
    __slots__ = ("text", "is_final", "start_ms", "end_ms", "words", "confidence", "no_speech_probability", "alternatives", "language", "utterance_index", "latency_ms", "turn_index")
    TEXT_FIELD_NUMBER: _ClassVar[int]
    IS_FINAL_FIELD_NUMBER: _ClassVar[int]
    START_MS_FIELD_NUMBER: _ClassVar[int]
    END_MS_FIELD_NUMBER: _ClassVar[int]
    WORDS_FIELD_NUMBER: _ClassVar[int]
    CONFIDENCE_FIELD_NUMBER: _ClassVar[int]
    NO_SPEECH_PROBABILITY_FIELD_NUMBER: _ClassVar[int]
    ALTERNATIVES_FIELD_NUMBER: _ClassVar[int]
    LANGUAGE_FIELD_NUMBER: _ClassVar[int]
    UTTERANCE_INDEX_FIELD_NUMBER: _ClassVar[int]
    LATENCY_MS_FIELD_NUMBER: _ClassVar[int]
    TURN_INDEX_FIELD_NUMBER: _ClassVar[int]
    text: str
    is_final: bool
    start_ms: int
    end_ms: int
    words: _containers.RepeatedCompositeFieldContainer[Word]
    confidence: float
    no_speech_probability: float
    alternatives: _containers.RepeatedCompositeFieldContainer[Alternative]
    language: str
    utterance_index: int
    latency_ms: int
    turn_index: int
    def __init__(self, text: _Optional[str] = ..., is_final: bool = ..., start_ms: _Optional[int] = ..., end_ms: _Optional[int] = ..., words: _Optional[_Iterable[_Union[Word, _Mapping]]] = ..., confidence: _Optional[float] = ..., no_speech_probability: _Optional[float] = ..., alternatives: _Optional[_Iterable[_Union[Alternative, _Mapping]]] = ..., language: _Optional[str] = ..., utterance_index: _Optional[int] = ..., latency_ms: _Optional[int] = ..., turn_index: _Optional[int] = ...) -> None: ...

class EndOfTurn(_message.Message):
    __slots__ = ("turn_index", "probability", "offset_ms", "text", "first_utterance_index", "last_utterance_index", "reason", "silence_ms", "latency_ms")
    TURN_INDEX_FIELD_NUMBER: _ClassVar[int]
    PROBABILITY_FIELD_NUMBER: _ClassVar[int]
    OFFSET_MS_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    FIRST_UTTERANCE_INDEX_FIELD_NUMBER: _ClassVar[int]
    LAST_UTTERANCE_INDEX_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    SILENCE_MS_FIELD_NUMBER: _ClassVar[int]
    LATENCY_MS_FIELD_NUMBER: _ClassVar[int]
    turn_index: int
    probability: float
    offset_ms: int
    text: str
    first_utterance_index: int
    last_utterance_index: int
    reason: str
    silence_ms: int
    latency_ms: int
    def __init__(self, turn_index: _Optional[int] = ..., probability: _Optional[float] = ..., offset_ms: _Optional[int] = ..., text: _Optional[str] = ..., first_utterance_index: _Optional[int] = ..., last_utterance_index: _Optional[int] = ..., reason: _Optional[str] = ..., silence_ms: _Optional[int] = ..., latency_ms: _Optional[int] = ...) -> None: ...

class AudioOut(_message.Message):
    __slots__ = ("data", "sequence_number", "speak_id", "offset_ms", "is_last")
    DATA_FIELD_NUMBER: _ClassVar[int]
    SEQUENCE_NUMBER_FIELD_NUMBER: _ClassVar[int]
    SPEAK_ID_FIELD_NUMBER: _ClassVar[int]
    OFFSET_MS_FIELD_NUMBER: _ClassVar[int]
    IS_LAST_FIELD_NUMBER: _ClassVar[int]
    data: bytes
    sequence_number: int
    speak_id: str
    offset_ms: int
    is_last: bool
    def __init__(self, data: _Optional[bytes] = ..., sequence_number: _Optional[int] = ..., speak_id: _Optional[str] = ..., offset_ms: _Optional[int] = ..., is_last: bool = ...) -> None: ...

class MarkReached(_message.Message):
    __slots__ = ("name",)
    NAME_FIELD_NUMBER: _ClassVar[int]
    name: str
    def __init__(self, name: _Optional[str] = ...) -> None: ...

class PlaybackInterrupted(_message.Message):
    __slots__ = ("speak_id", "played_ms", "words_played", "at_offset_ms", "caller_text")
    SPEAK_ID_FIELD_NUMBER: _ClassVar[int]
    PLAYED_MS_FIELD_NUMBER: _ClassVar[int]
    WORDS_PLAYED_FIELD_NUMBER: _ClassVar[int]
    AT_OFFSET_MS_FIELD_NUMBER: _ClassVar[int]
    CALLER_TEXT_FIELD_NUMBER: _ClassVar[int]
    speak_id: str
    played_ms: int
    words_played: _containers.RepeatedScalarFieldContainer[str]
    at_offset_ms: int
    caller_text: str
    def __init__(self, speak_id: _Optional[str] = ..., played_ms: _Optional[int] = ..., words_played: _Optional[_Iterable[str]] = ..., at_offset_ms: _Optional[int] = ..., caller_text: _Optional[str] = ...) -> None: ...

class PlaybackFinished(_message.Message):
    __slots__ = ("speak_id", "duration_ms")
    SPEAK_ID_FIELD_NUMBER: _ClassVar[int]
    DURATION_MS_FIELD_NUMBER: _ClassVar[int]
    speak_id: str
    duration_ms: int
    def __init__(self, speak_id: _Optional[str] = ..., duration_ms: _Optional[int] = ...) -> None: ...

class QualityChanged(_message.Message):
    __slots__ = ("shed", "description")
    SHED_FIELD_NUMBER: _ClassVar[int]
    DESCRIPTION_FIELD_NUMBER: _ClassVar[int]
    shed: _containers.RepeatedScalarFieldContainer[str]
    description: str
    def __init__(self, shed: _Optional[_Iterable[str]] = ..., description: _Optional[str] = ...) -> None: ...

class ErrorEvent(_message.Message):
    __slots__ = ("code", "message", "scope", "utterance_index", "speak_id")
    CODE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    SCOPE_FIELD_NUMBER: _ClassVar[int]
    UTTERANCE_INDEX_FIELD_NUMBER: _ClassVar[int]
    SPEAK_ID_FIELD_NUMBER: _ClassVar[int]
    code: int
    message: str
    scope: str
    utterance_index: int
    speak_id: str
    def __init__(self, code: _Optional[int] = ..., message: _Optional[str] = ..., scope: _Optional[str] = ..., utterance_index: _Optional[int] = ..., speak_id: _Optional[str] = ...) -> None: ...

class SynthesizeRequest(_message.Message):
    __slots__ = ("text", "voice", "output_audio", "rate", "speaker_id")
    TEXT_FIELD_NUMBER: _ClassVar[int]
    VOICE_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_AUDIO_FIELD_NUMBER: _ClassVar[int]
    RATE_FIELD_NUMBER: _ClassVar[int]
    SPEAKER_ID_FIELD_NUMBER: _ClassVar[int]
    text: str
    voice: str
    output_audio: AudioFormat
    rate: float
    speaker_id: int
    def __init__(self, text: _Optional[str] = ..., voice: _Optional[str] = ..., output_audio: _Optional[_Union[AudioFormat, _Mapping]] = ..., rate: _Optional[float] = ..., speaker_id: _Optional[int] = ...) -> None: ...

class SynthesizeResponse(_message.Message):
    __slots__ = ("data", "sequence_number", "offset_ms", "is_last", "words")
    DATA_FIELD_NUMBER: _ClassVar[int]
    SEQUENCE_NUMBER_FIELD_NUMBER: _ClassVar[int]
    OFFSET_MS_FIELD_NUMBER: _ClassVar[int]
    IS_LAST_FIELD_NUMBER: _ClassVar[int]
    WORDS_FIELD_NUMBER: _ClassVar[int]
    data: bytes
    sequence_number: int
    offset_ms: int
    is_last: bool
    words: _containers.RepeatedCompositeFieldContainer[Word]
    def __init__(self, data: _Optional[bytes] = ..., sequence_number: _Optional[int] = ..., offset_ms: _Optional[int] = ..., is_last: bool = ..., words: _Optional[_Iterable[_Union[Word, _Mapping]]] = ...) -> None: ...

class ListModelsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ModelInfo(_message.Message):
    __slots__ = ("name", "family", "languages", "device", "compute_type", "is_default", "loaded")
    NAME_FIELD_NUMBER: _ClassVar[int]
    FAMILY_FIELD_NUMBER: _ClassVar[int]
    LANGUAGES_FIELD_NUMBER: _ClassVar[int]
    DEVICE_FIELD_NUMBER: _ClassVar[int]
    COMPUTE_TYPE_FIELD_NUMBER: _ClassVar[int]
    IS_DEFAULT_FIELD_NUMBER: _ClassVar[int]
    LOADED_FIELD_NUMBER: _ClassVar[int]
    name: str
    family: str
    languages: _containers.RepeatedScalarFieldContainer[str]
    device: str
    compute_type: str
    is_default: bool
    loaded: bool
    def __init__(self, name: _Optional[str] = ..., family: _Optional[str] = ..., languages: _Optional[_Iterable[str]] = ..., device: _Optional[str] = ..., compute_type: _Optional[str] = ..., is_default: bool = ..., loaded: bool = ...) -> None: ...

class ListModelsResponse(_message.Message):
    __slots__ = ("models", "turn_detection")
    MODELS_FIELD_NUMBER: _ClassVar[int]
    TURN_DETECTION_FIELD_NUMBER: _ClassVar[int]
    models: _containers.RepeatedCompositeFieldContainer[ModelInfo]
    turn_detection: TurnDetectionInfo
    def __init__(self, models: _Optional[_Iterable[_Union[ModelInfo, _Mapping]]] = ..., turn_detection: _Optional[_Union[TurnDetectionInfo, _Mapping]] = ...) -> None: ...

class TurnDetectionInfo(_message.Message):
    __slots__ = ("modes", "default_mode", "audio_model")
    MODES_FIELD_NUMBER: _ClassVar[int]
    DEFAULT_MODE_FIELD_NUMBER: _ClassVar[int]
    AUDIO_MODEL_FIELD_NUMBER: _ClassVar[int]
    modes: _containers.RepeatedScalarFieldContainer[TurnDetection]
    default_mode: TurnDetection
    audio_model: str
    def __init__(self, modes: _Optional[_Iterable[_Union[TurnDetection, str]]] = ..., default_mode: _Optional[_Union[TurnDetection, str]] = ..., audio_model: _Optional[str] = ...) -> None: ...

class ListVoicesRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class VoiceInfo(_message.Message):
    __slots__ = ("name", "language", "sample_rate_hertz", "num_speakers", "is_default", "license_note")
    NAME_FIELD_NUMBER: _ClassVar[int]
    LANGUAGE_FIELD_NUMBER: _ClassVar[int]
    SAMPLE_RATE_HERTZ_FIELD_NUMBER: _ClassVar[int]
    NUM_SPEAKERS_FIELD_NUMBER: _ClassVar[int]
    IS_DEFAULT_FIELD_NUMBER: _ClassVar[int]
    LICENSE_NOTE_FIELD_NUMBER: _ClassVar[int]
    name: str
    language: str
    sample_rate_hertz: int
    num_speakers: int
    is_default: bool
    license_note: str
    def __init__(self, name: _Optional[str] = ..., language: _Optional[str] = ..., sample_rate_hertz: _Optional[int] = ..., num_speakers: _Optional[int] = ..., is_default: bool = ..., license_note: _Optional[str] = ...) -> None: ...

class ListVoicesResponse(_message.Message):
    __slots__ = ("voices",)
    VOICES_FIELD_NUMBER: _ClassVar[int]
    voices: _containers.RepeatedCompositeFieldContainer[VoiceInfo]
    def __init__(self, voices: _Optional[_Iterable[_Union[VoiceInfo, _Mapping]]] = ...) -> None: ...

class BotEvent(_message.Message):
    __slots__ = ("call", "converse", "transfer_result")
    CALL_FIELD_NUMBER: _ClassVar[int]
    CONVERSE_FIELD_NUMBER: _ClassVar[int]
    TRANSFER_RESULT_FIELD_NUMBER: _ClassVar[int]
    call: CallInfo
    converse: ConverseResponse
    transfer_result: TransferResult
    def __init__(self, call: _Optional[_Union[CallInfo, _Mapping]] = ..., converse: _Optional[_Union[ConverseResponse, _Mapping]] = ..., transfer_result: _Optional[_Union[TransferResult, _Mapping]] = ...) -> None: ...

class CallInfo(_message.Message):
    __slots__ = ("call_id", "from_uri", "to_uri", "channel", "headers", "transfer_supported")
    class HeadersEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    CALL_ID_FIELD_NUMBER: _ClassVar[int]
    FROM_URI_FIELD_NUMBER: _ClassVar[int]
    TO_URI_FIELD_NUMBER: _ClassVar[int]
    CHANNEL_FIELD_NUMBER: _ClassVar[int]
    HEADERS_FIELD_NUMBER: _ClassVar[int]
    TRANSFER_SUPPORTED_FIELD_NUMBER: _ClassVar[int]
    call_id: str
    from_uri: str
    to_uri: str
    channel: str
    headers: _containers.ScalarMap[str, str]
    transfer_supported: bool
    def __init__(self, call_id: _Optional[str] = ..., from_uri: _Optional[str] = ..., to_uri: _Optional[str] = ..., channel: _Optional[str] = ..., headers: _Optional[_Mapping[str, str]] = ..., transfer_supported: bool = ...) -> None: ...

class BotAction(_message.Message):
    __slots__ = ("request", "transfer", "answer")
    REQUEST_FIELD_NUMBER: _ClassVar[int]
    TRANSFER_FIELD_NUMBER: _ClassVar[int]
    ANSWER_FIELD_NUMBER: _ClassVar[int]
    request: ConverseRequest
    transfer: Transfer
    answer: Answer
    def __init__(self, request: _Optional[_Union[ConverseRequest, _Mapping]] = ..., transfer: _Optional[_Union[Transfer, _Mapping]] = ..., answer: _Optional[_Union[Answer, _Mapping]] = ...) -> None: ...

class Transfer(_message.Message):
    __slots__ = ("target_uri", "transfer_id")
    TARGET_URI_FIELD_NUMBER: _ClassVar[int]
    TRANSFER_ID_FIELD_NUMBER: _ClassVar[int]
    target_uri: str
    transfer_id: str
    def __init__(self, target_uri: _Optional[str] = ..., transfer_id: _Optional[str] = ...) -> None: ...

class TransferResult(_message.Message):
    __slots__ = ("transfer_id", "code", "message", "sip_status")
    TRANSFER_ID_FIELD_NUMBER: _ClassVar[int]
    CODE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    SIP_STATUS_FIELD_NUMBER: _ClassVar[int]
    transfer_id: str
    code: int
    message: str
    sip_status: int
    def __init__(self, transfer_id: _Optional[str] = ..., code: _Optional[int] = ..., message: _Optional[str] = ..., sip_status: _Optional[int] = ...) -> None: ...

class Answer(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...
