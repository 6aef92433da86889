// The hflow language: the grammar of the first subset (meshes, models, roles,
// placement, flows of role calls). docs/language.md is the reference.
grammar Hflow;

program : importDecl* decl* EOF ;

// import "std/devices"          (the standard library)
// import "models/llama.hflow"   (relative to the importing file, then -I dirs)
importDecl : 'import' path=STRING ;

decl
  : deviceDecl
  | clusterDecl
  | modelDecl
  | roleDecl
  | placeDecl
  | flowDecl
  | trainDecl
  ;

// device a100_80g = gpu(memory: 80GB, bf16: 312TFLOPS, fp32: 19.5TFLOPS,
//                       bandwidth: 2039GB/s)
deviceDecl : 'device' name=ID '=' ctor=call ;

// cluster local = mesh(cpu, nodes: 1, per_node: 4)
clusterDecl : 'cluster' name=ID '=' ctor=call ;

// model tiny = llama(layers: 2, hidden: 64, ...)
modelDecl : 'model' name=ID '=' ctor=call ;

// role actor = Actor(tiny) { train: dp(2), generate: tp(2) }
roleDecl : 'role' name=ID '=' ctor=call roleBody? ;
roleBody : '{' ( prop ( ',' prop )* ','? )? '}' ;
prop     : key=word ':' value=expr ;
// Keys may be words the grammar also uses as keywords (`train: dp(2)`).
word     : ID | 'train' | 'every' | 'to' | 'on' | 'model' | 'device' | 'flow'
         | 'auto' ;

// place actor, ref on local[0:2]
// place auto                   (the compiler chooses; `on MESH` if there are several)
// place actor.generate on local[2:4]   (the actor's rollout devices, apart from training)
placeDecl
  : 'place' roles+=ID ( ',' roles+=ID )* 'on' mesh=ID '[' lo=INT ':' hi=INT ']'
  | 'place' genRole=ID '.' phase=ID 'on' mesh=ID '[' lo=INT ':' hi=INT ']'
  | 'place' isAuto='auto' ( 'on' mesh=ID )?
  ;

// flow step(prompts: Prompts) { let r = actor.generate(prompts) ... }
flowDecl : 'flow' name=ID '(' ( param ( ',' param )* )? ')' '{' stmt* '}' ;
param    : name=ID ':' type=ID ;
stmt
  : 'let' name=ID '=' value=expr ';'?   # LetStmt
  | value=expr ';'?                    # ExprStmt
  ;

// train step { data: "prompts.jsonl", batch: 256, n: 8, steps: 1000,
//              minibatch: 64, seed: 1, checkpoint: every 100 to "ckpt/" }
trainDecl : 'train' flow=ID '{' ( prop ( ',' prop )* ','? )? '}' ;

// Precedence, tightest first: unary minus, * and /, + and - (all left-assoc).
expr
  : op='-' operand=expr                         # NegExpr
  | lhs=expr op=( '*' | '/' ) rhs=expr          # MulExpr
  | lhs=expr op=( '+' | '-' ) rhs=expr          # AddExpr
  | 'every' count=INT 'to' dir=STRING           # EveryExpr
  | recv=ID '.' method=ID '(' argList? ')'      # MethodCallExpr
  | recv=ID '.' field=ID                        # FieldExpr
  | call                                        # CallExpr
  | 'auto'                                      # AutoExpr
  | ID                                          # NameExpr
  | QUANTITY                                    # QuantityExpr
  | INT                                         # IntExpr
  | FLOAT                                       # FloatExpr
  | STRING                                      # StringExpr
  | '(' expr ')'                                # ParenExpr
  ;

call    : callee=ID '(' argList? ')' ;
argList : arg ( ',' arg )* ','? ;
arg     : ( key=word ':' )? value=expr ;

ID      : [a-zA-Z_] [a-zA-Z0-9_]* ;
// A number with a unit: 80GB, 2TB/s, 200Gbps, 312TFLOPS, 19.5TFLOPS.
QUANTITY : [0-9]+ ( '.' [0-9]+ )? [a-zA-Z]+ ( '/' [a-zA-Z]+ )? ;
FLOAT   : [0-9]+ '.' [0-9]* ( [eE] [+-]? [0-9]+ )?
        | [0-9]+ [eE] [+-]? [0-9]+ ;
INT     : [0-9]+ ;
STRING  : '"' ( ~["\\\r\n] | '\\' . )* '"' ;

LINE_COMMENT  : '//' ~[\r\n]* -> skip ;
BLOCK_COMMENT : '/*' .*? '*/' -> skip ;
WS            : [ \t\r\n]+ -> skip ;
// Anything else is a lexical error reported with its location.
ERROR_CHAR    : . ;
