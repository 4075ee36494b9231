"""The word list behind the reference policy's vocabulary.

Guarantees: the list is fixed in code (no downloads), every word is lowercase ASCII
letters only (so the pre-tokenizer never splits a word, which is what lets the sampler
emit canonical token sequences), and `WORDS` holds each word once, in a stable order.
Changing this list changes every token id above the byte range, so treat it as part of
the reference policy's contract: append, never reorder.
"""

from __future__ import annotations

_RAW = """
the of and to in is it you that he was for on are with as his they be at one have this
from or had by not word but what some we can out other were all there when up use your
how said an each she which do their time if will way about many then them write would
like so these her long make thing see him two has look more day could go come did number
sound no most people my over know water than call first who may down side been now find
any new work part take get place made live where after back little only round man year
came show every good me give our under name very through just form sentence great think
say help low line differ turn cause much mean before move right boy old too same tell
does set three want air well also play small end put home read hand port large spell add
even land here must big high such follow act why ask men change went light kind off need
house picture try us again animal point mother world near build self earth father head
stand own page should country found answer school grow study still learn plant cover food
sun four between state keep eye never last let thought city tree cross farm hard start
might story saw far sea draw left late run while press close night real life few north
open seem together next white children begin got walk example ease paper group always
music those both mark often letter until mile river car feet care second book carry took
science eat room friend began idea fish mountain stop once base hear horse cut sure watch
color face wood main enough plain girl usual young ready above ever red list though feel
talk bird soon body dog family direct pose leave song measure door product black short
numeral class wind question happen complete ship area half rock order fire south problem
piece told knew pass since top whole king space heard best hour better true during hundred
five remember step early hold west ground interest reach fast verb sing listen six table
travel less morning ten simple several vowel toward war lay against pattern slow center
love person money serve appear road map rain rule govern pull cold notice voice unit power
town fine certain fly fall lead cry dark machine note wait plan figure star box noun field
rest correct able pound done beauty drive stood contain front teach week final gave green
quick develop ocean warm free minute strong special mind behind clear tail produce fact
street inch multiply nothing course stay wheel full force blue object decide surface deep
moon island foot system busy test record boat common gold possible plane stead dry wonder
laugh thousand ago ran check game shape equate hot miss brought heat snow tire bring yes
distant fill east paint language among grand ball yet wave drop heart present heavy dance
engine position arm wide sail material size vary settle speak weight general ice matter
circle pair include divide syllable felt perhaps pick sudden count square reason length
represent art subject region energy hunt probable bed brother egg ride cell believe
fraction forest sit race window store summer train sleep prove lone exercise wall catch
mount wish sky board joy winter sat written wild instrument kept glass grass cow job edge
sign visit past soft fun bright gas weather month million bear finish happy hope flower
clothe strange gone jump baby eight village meet root buy raise solve metal whether push
seven paragraph third shall held hair describe cook floor either result burn hill safe cat
century consider type law bit coast copy phrase silent tall sand soil roll temperature
finger industry value fight lie beat excite natural view sense ear else quite broke case
middle kill son lake moment scale loud spring observe child straight consonant nation
dictionary milk speed method organ pay age section dress cloud surprise quiet stone tiny
climb cool design poor lot experiment bottom key iron single stick flat twenty skin smile
crease hole trade melody trip office receive row mouth exact symbol die least trouble
shout except wrote seed tone join suggest clean break lady yard rise bad blow oil blood
touch grew cent mix team wire cost lost brown wear garden equal sent choose fell fit flow
fair bank collect save control decimal gentle woman captain practice separate difficult
doctor please protect noon whose locate ring character insect caught period indicate
radio spoke atom human history effect electric expect crop modern element hit student
corner party supply bone rail imagine provide agree thus capital chair danger fruit rich
thick soldier process operate guess necessary sharp wing create neighbor wash bat rather
crowd corn compare poem string bell depend meat rub tube famous dollar stream fear sight
thin triangle planet hurry chief colony clock mine tie enter major fresh search send
yellow gun allow print dead spot desert suit current lift rose continue block chart hat
sell success company subtract event particular deal swim term opposite wife shoe shoulder
spread arrange camp invent cotton born determine quart nine truck noise level chance
gather shop stretch throw shine property column molecule select wrong gray repeat require
broad prepare salt nose plural anger claim continent oxygen sugar death pretty skill
women season solution magnet silver thank branch match suffix especially fig afraid huge
sister steel discuss forward similar guide experience score apple bought led pitch coat
mass card band rope slip win dream evening condition feed tool total basic smell valley
nor double seat arrive master track parent shore division sheet substance favor connect
post spend chord fat glad original share station dad bread charge proper bar offer segment
slave duck instant market degree populate chick dear enemy reply drink occur support
speech nature range steam motion path liquid log meant quotient teeth shell neck
agent tokentrail policy token model trace rollout reward server client request response
file path command echo bash shell script code function class method module package import
export return value variable string integer boolean array object null true false error
warning info debug log output input result status success failure retry timeout cache
buffer stream chunk event topic partition offset broker consumer producer message queue
record schema field table index key data base version update delete insert select query
filter sort merge split join parse format render template prompt tool call turn chain
branch commit push pull repository directory folder home user admin system assistant
config setting option default flag argument parameter option build compile install deploy
service network socket port host address route handler middleware proxy gateway local
remote memory disk storage compute process thread task job worker pool lock mutex signal
batch sample train learn weight gradient loss score metric measure count total average
mean median limit bound range step epoch stage phase level layer node edge graph tree
list map set queue stack heap hash digest sum check verify validate test assert expect
match find search scan read write open close load save store fetch send receive accept
reject allow deny grant access token secret public private internal external global
local unique empty full single double first last next previous current final initial
start stop begin end create destroy add remove append prepend replace reset clear flush
sync async await wait sleep wake run execute launch spawn kill exit quit abort cancel
fail pass skip ignore handle catch throw raise emit publish subscribe notify listen
watch poll scroll click press type paste copy cut move drag drop resize zoom view show
hide display print draw paint color style theme font size width height depth length
line column row cell grid frame window panel page tab menu button label text image icon
video audio sound music voice speech word letter digit number character symbol sign
simple complex quick slow fast easy hard soft light dark bright clean dirty fresh stale
ready busy idle active passive live dead valid invalid safe unsafe stable unstable
correct wrong exact approximate precise rough smooth sharp blunt strong weak heavy light
plan goal task idea note draft summary report review analysis detail overview context
question answer problem solution reason cause effect impact change issue bug fix patch
feature improvement release milestone deadline schedule calendar date today tomorrow
yesterday hour minute second week month year moment period interval duration
arguments description properties required parameters enum items content role name
tools calls results reasoning think thinking answers questions files commands messages
tokens models values strings numbers objects arrays lists keys fields records events
grep glob edit todo notebook fetch web url http https json yaml toml csv text markdown
python rust java javascript typescript node npm pip cargo git docker linux unix windows
about above across actually add address again against almost alone along already
always amount another anyone anything anyway appear apply approach around article
assume attention available avoid away become behavior below benefit beyond born
brief bring budget building business camera cannot career carry certainly choice
citizen clearly coach collection community compute concern conference congress
consumer cost could couple create culture customer daughter debate decade defense
degree democratic describe despite difference direction director discover discussion
disease doctor economy edge education effort eight election else employee encourage
environment especially establish evening everybody everyone everything evidence exactly
executive exist expert explain factor federal feeling finally financial firm focus
foreign forget former forward friend future generation glass growth guess hair happen
health herself himself hospital hotel however identify image imagine improve indeed
individual information inside instead institution interview investment itself kitchen
knowledge language later lawyer leader least legal likely listen little local major
manage management manager market material maybe media medical member memory mention
military minute mission modern morning mother movement myself national natural nearly
necessary network news newspaper nothing notice officer official often operation
opportunity option organization others outside owner painting partner patient pattern
peace perform performance personal physical pick picture political popular population
position positive possible pressure pretty prevent price private probably production
professional professor program project protect provide purpose quality quickly radio
rather reality realize really recent recently recognize reduce reflect region relate
relationship religious remain remove represent republican research resource respond
responsibility rest return reveal rich right risk rock rule safe scene scientist
season security seek seem senior sense series serious serve seven several sexual
shake share shoot shot should shoulder significant similar simply since sing sister
situation skill social society soldier somebody someone something sometimes source
southern speak specific sport staff standard statement stock strategy structure
student stuff style successful suddenly suffer suggest summer support surface
teacher technology television tend themselves theory third thought threat throughout
tonight total tough toward traditional treat treatment trial trouble truth twenty
understand until upon usually various victim violence visit wall weapon whatever
whether window within without wonder worker worry yourself
"""

# Words that get a capitalised form as well, so a sampled sentence can start with one
# canonical token (e.g. "The") instead of a split byte sequence.
_CAPITALISED = """
the it this that there they we you he she a an our my your his her its these those
some many most each every all one two three first next then now here today yes no
if when while after before because although since so but and or however therefore
please let thanks sure okay done result answer note summary plan step check run read
write file command tool policy model data system user assistant token bash edit grep
glob search fetch list find open done great good fine
"""


def _unique(text: str) -> tuple[str, ...]:
    # dict.fromkeys keeps the first occurrence, so the order (and thus every id) is stable.
    words = dict.fromkeys(w for w in text.split() if w.isascii() and w.isalpha())
    return tuple(w.lower() for w in words)


WORDS: tuple[str, ...] = tuple(dict.fromkeys(_unique(_RAW)))
CAPITALISED: tuple[str, ...] = tuple(
    dict.fromkeys(w.capitalize() for w in _unique(_CAPITALISED) if len(w) > 1)
)

# Multi-character punctuation and JSON pieces. They follow the pre-tokenizer's runs of
# non-letter, non-digit characters (` ?[^\s\w]+`), so a JSON body such as
# `{"name": "Bash", "arguments": {"command": "x"}}` maps onto whole pieces.
PUNCTUATION: tuple[str, ...] = (
    '{"', '":', ' "', '",', '"}', '"}}', ' {"', '["', '"]', '"]}', ' ["', '"],', '},',
    '}}', '{}', '[]', ' {}', ' []', '""', ' ""', '":"', '","', '":{"', '":["', '"},',
    '"}]', '}]', ']}', '],', ' [', ' {', ' }', ' ]', '":{', '": {', ' (', '()', '),',
    ').', ');', '();', ' ()', '("', '")', '");', ' -', ' --', '--', ' =', '==', ' ==',
    '=>', ' =>', '->', ' ->', '...', ' ...', '://', ' #', '##', ' ##', '###', ' *', '**',
    ' **', ' /', '</', '/>', ' <', '">', ' \'', "',", "':", "')", "('", ' `', '```', ' ```',
    ' $', ' &', '&&', ' &&', ' |', '||', ' ||', ' +', ' :', ' ;', ' ?', ' !', ' .',
    ' ,', '.,', '.:', '?"', '!"', '."', ',"', ' %', '%)', ' @', ' ~', ' ~/', './', '../',
)

# Whitespace runs the pre-tokenizer produces (`\s+(?!\S)` keeps the last space for
# the next word, so "\n    x" yields "\n   " + " x").
WHITESPACE: tuple[str, ...] = (
    "\n\n", "\n\n\n", "  ", "   ", "    ", "     ", "       ", "        ", "\t\t",
    "\n ", "\n  ", "\n   ", "\n    ", "\n     ", "\n       ", "\n\t", "\n\t\t", " \n",
)
